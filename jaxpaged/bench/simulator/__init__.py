"""Benchmarks against the simulated device: the host side of a step measured where the device takes a profile's time."""
