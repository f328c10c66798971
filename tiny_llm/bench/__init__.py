"""Throughput: benchmark worker, packed benchmark and its summary, tuning candidates and runner, profiling."""
