"""Thin CLI adapters: parse arguments, call the library, print JSON."""
