"""Formerly a script: now `jaxpaged bench throughput`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench throughput")
