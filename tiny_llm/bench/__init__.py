"""Throughput: benchmark worker, tuning candidates and runner, MFU, profiling."""
