"""``python -m jaxpaged``: the `jaxpaged` command line."""

from jaxpaged.cli.main import main

if __name__ == "__main__":
    main()
