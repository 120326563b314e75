"""Formerly a script: now `jaxpaged bench ablate`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench ablate")
