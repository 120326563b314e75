"""Formerly a script: now `jaxpaged bench offload`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench offload")
