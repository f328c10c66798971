"""Throughput: benchmark worker, packed benchmark and its summary, profiling."""
