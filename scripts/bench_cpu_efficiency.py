"""Formerly a script: now `jaxpaged bench cpu-efficiency`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench cpu-efficiency")
