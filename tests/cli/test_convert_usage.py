"""`jaxpaged convert` refuses a checkpoint it cannot read with the CLI's one-line usage error, not a traceback."""

import pytest

from jaxpaged.cli import main as cli


@pytest.mark.parametrize("flag", ["--hf_dir", "--model"])
def test_missing_checkpoint_is_one_usage_line(tmp_path, capsys, flag):
    missing = tmp_path / "MISSING"
    assert cli.run(["jaxpaged", "convert", f"{flag}={missing}", f"--out_dir={tmp_path / 'out'}"]) == 1
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and "--model" in errors[0] and str(missing) in errors[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
