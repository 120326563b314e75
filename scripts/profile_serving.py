"""Formerly a script: now `jaxpaged bench profile`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench profile")
