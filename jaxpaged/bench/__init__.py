"""Benchmarks, grouped by what they measure: `offline/` (the engine in-process), `online/` (a live server),
`simulator/` (the host side against a simulated device); `output.py` writes every result."""
