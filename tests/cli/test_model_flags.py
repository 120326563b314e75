"""`jaxpaged convert` refuses a checkpoint it cannot read with the one-line usage error; `jaxpaged serve` defaults to
the pretrained GGUF."""

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


def test_serve_without_model_serves_the_pretrained_gguf():
    from jaxpaged.cli.commands import find
    from jaxpaged.gguf_file import is_gguf_file
    from jaxpaged.pretrained import default_model_path

    command, _ = find(["jaxpaged", "serve"])
    module, _ = cli.parse(command, [])
    assert module.MODEL.value == str(default_model_path())
    assert is_gguf_file(module.MODEL.value), "run `make model`"
