"""Formerly a script: now `jaxpaged check-dashboard`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("check-dashboard")
