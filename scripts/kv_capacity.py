"""Formerly a script: now `jaxpaged capacity`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("capacity")
