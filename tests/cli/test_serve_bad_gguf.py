"""`jaxpaged serve --model=FILE.gguf` refuses a GGUF file it cannot serve with one usage line, before it starts
anything: a missing file, a file that is not a GGUF, an unsupported architecture, a missing tensor."""

import pytest

from jaxpaged.cli import main as cli
from tests.checkpoint.gguf_files import write_gguf
from tests.checkpoint.test_checkpoint_hf import BASE_HF_CONFIG, random_hf_weights


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    """name -> (path, a phrase its error must contain)."""
    root = tmp_path_factory.mktemp("bad_gguf")
    weights = random_hf_weights(BASE_HF_CONFIG, seed=1)
    falcon = write_gguf(root / "falcon.gguf", BASE_HF_CONFIG, weights, arch="falcon")
    del weights["model.layers.1.mlp.up_proj.weight"]
    broken = write_gguf(root / "broken.gguf", BASE_HF_CONFIG, weights)
    text = root / "text.gguf"
    text.write_text("not a gguf file")
    return {"missing": (root / "missing.gguf", "GGUF file"), "not-gguf": (text, "GGUF file"),
            "unsupported-architecture": (falcon, "unsupported GGUF architecture 'falcon'"),
            "missing-tensor": (broken, "missing tensors: ['model.layers.1.mlp.up_proj.weight']")}


@pytest.mark.parametrize("case", ["missing", "not-gguf", "unsupported-architecture", "missing-tensor"])
def test_unservable_gguf_is_one_usage_line(bad_files, capsys, case):
    path, phrase = bad_files[case]
    assert cli.run(["jaxpaged", "serve", f"--model={path}", "--port=1"]) == 1
    err = capsys.readouterr().err
    fatal = [line for line in err.splitlines() if line.startswith("FATAL")]
    assert len(fatal) == 1 and f"--model={path}" in fatal[0] and phrase in fatal[0], err
    assert "Traceback" not in err
