"""Formerly a script: now `jaxpaged bench logit-controls`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

forward("bench logit-controls")
