"""Serving benchmark: workloads, the driver that runs them through an Engine, and reports."""
