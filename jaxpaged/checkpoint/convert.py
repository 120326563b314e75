"""Convert a Hugging Face checkpoint or a GGUF file into a jaxpaged Orbax checkpoint."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from jaxpaged.checkpoint.gguf import load_gguf_checkpoint
from jaxpaged.checkpoint.hf import load_hf_checkpoint
from jaxpaged.checkpoint.orbax_io import save_params
from jaxpaged.gguf_file import is_gguf_file

# Copied alongside the weights so `load_tokenizer(out_dir, ...)` finds the same tokenizer and stop ids.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "generation_config.json", "chat_template.jinja", "chat_template.json")


def convert_hf_to_orbax(hf_dir: str | Path, out_dir: str | Path, dtype=None) -> Path:
    """Load `hf_dir` (a Hugging Face directory or a GGUF file), cast to `dtype` (default: the checkpoint's),
    save as Orbax under `out_dir`, with the tokenizer and chat template beside it."""
    source, out_dir = Path(hf_dir), Path(out_dir)
    if is_gguf_file(source):
        save_params(load_gguf_checkpoint(source, dtype=dtype), out_dir)
        write_gguf_tokenizer_files(source, out_dir)
        return out_dir
    model = load_hf_checkpoint(source, dtype=dtype)
    save_params(model, out_dir)
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, out_dir / name)
    return out_dir


def write_gguf_tokenizer_files(gguf_path: Path, out_dir: Path) -> None:
    """The GGUF's tokenizer as `tokenizer.json`, its chat template and special tokens as `tokenizer_config.json`,
    its BOS and stop ids as `generation_config.json`: what `load_tokenizer` and `ChatTemplate` read."""
    from jaxpaged.gguf_tokenizer import gguf_chat_template
    from jaxpaged.tokenizer import load_gguf_tokenizer

    tokenizer = load_gguf_tokenizer(gguf_path)
    tokenizer.backend.save(str(out_dir / "tokenizer.json"))
    template, bos, eos = gguf_chat_template(gguf_path)
    config = {"bos_token": bos or None, "eos_token": eos or None}
    if template is not None:
        config["chat_template"] = template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": sorted(tokenizer.stop_token_ids)}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2))
