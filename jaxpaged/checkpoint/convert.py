"""Convert a Hugging Face checkpoint into a jaxpaged Orbax checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from jaxpaged.checkpoint.hf import load_hf_checkpoint
from jaxpaged.checkpoint.orbax_io import save_params

# Copied alongside the weights so `load_tokenizer(out_dir, ...)` finds the same tokenizer and stop ids.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json")


def convert_hf_to_orbax(hf_dir: str | Path, out_dir: str | Path, dtype=None) -> Path:
    """Load `hf_dir`, cast to `dtype` (default: the checkpoint's), save as Orbax under `out_dir`."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    model = load_hf_checkpoint(hf_dir, dtype=dtype)
    save_params(model, out_dir)
    for name in TOKENIZER_FILES:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, out_dir / name)
    return out_dir
