"""Formerly a script: now `jaxpaged bench replay-cache`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench replay-cache")
