"""Formerly a script: now `jaxpaged bench http-overhead`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench http-overhead")
