"""Formerly a script: now `jaxpaged bench engine-core`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench engine-core")
