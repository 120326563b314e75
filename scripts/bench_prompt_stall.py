"""Formerly a script: now `jaxpaged bench prompt-stall`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench prompt-stall")
