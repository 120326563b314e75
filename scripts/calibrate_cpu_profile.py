"""Formerly a script: now `jaxpaged calibrate`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("calibrate")
