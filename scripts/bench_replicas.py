"""Formerly a script: now `jaxpaged bench replicas`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench replicas")
