"""Formerly a script: now `jaxpaged capacity`, which this forwards its arguments to."""
from jaxpaged.cli.main import forward

if __name__ == "__main__":  # multiprocessing re-imports this module in its children
    forward("capacity")
