"""Formerly a script: now `jaxpaged convert`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("convert")
