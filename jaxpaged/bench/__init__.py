"""Benchmarks, one module per command's logic, grouped by what they measure: `offline/` (the engine in-process,
or over a sleeping simulated device), `online/` (a live server); `capacity` (KV capacity arithmetic).
Every result is written by `jaxpaged.report`."""
