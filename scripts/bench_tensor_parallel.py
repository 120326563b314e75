"""Formerly a script: now `jaxpaged bench tensor-parallel`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench tensor-parallel")
