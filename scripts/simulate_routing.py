"""Formerly a script: now `jaxpaged simulate routing`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("simulate routing")
