"""The benchmark tests run `jaxpaged` commands in this process."""

import pytest

from jaxpaged.cli import main as cli


@pytest.fixture
def run_command(capsys):
    """``run_command("bench serving", *flags)`` in this process: its stdout; it must exit 0."""
    def run(command: str, *args: str) -> str:
        code = cli.run(["jaxpaged", *command.split(), *args])
        out = capsys.readouterr()
        assert code == 0, out.err[-3000:]
        return out.out
    return run
