"""Formerly a script: now `jaxpaged simulate serving`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("simulate serving")
