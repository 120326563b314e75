"""Formerly a script: now `jaxpaged bench host-overhead`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench host-overhead")
