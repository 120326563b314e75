"""Formerly a script: now `jaxpaged bench block-manager`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench block-manager")
