"""Formerly a script: now `jaxpaged serve`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("serve")
