"""Formerly a script: now `jaxpaged bench hybrid-kv`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench hybrid-kv")
