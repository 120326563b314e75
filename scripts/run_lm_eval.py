"""Formerly a script: now `jaxpaged lm-eval`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("lm-eval")
