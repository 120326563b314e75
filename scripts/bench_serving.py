"""Formerly a script: now `jaxpaged bench serving`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench serving")
