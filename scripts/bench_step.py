"""Formerly a script: now `jaxpaged bench step`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench step")
