"""Formerly a script: now `jaxpaged bench attention`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench attention")
