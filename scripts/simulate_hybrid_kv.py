"""Formerly a script: now `jaxpaged simulate hybrid-kv`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("simulate hybrid-kv")
