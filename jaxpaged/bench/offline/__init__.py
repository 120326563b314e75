"""Offline benchmarks: the engine in-process, driven through workloads, steps and the cache alone."""
