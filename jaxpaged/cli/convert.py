"""Convert a Hugging Face Llama checkpoint to a jaxpaged Orbax checkpoint.

    jaxpaged convert --hf_dir=/models/Llama-3.2-1B --out_dir=/ckpt/llama1b --dtype=bfloat16

The output reloads with `jaxpaged.checkpoint.load_model(out_dir)` without the
safetensors name mapping; tokenizer files are copied alongside.
"""

from __future__ import annotations
from jaxpaged.checkpoint import convert_hf_to_orbax
from jaxpaged.cli.flagset import FlagSet

FLAGS = FlagSet()
FLAGS.DEFINE_string("hf_dir", None, "Hugging Face checkpoint directory (config.json + safetensors).")
FLAGS.DEFINE_string("out_dir", None, "Directory for the Orbax checkpoint (created).")
FLAGS.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                  "Weight dtype to store; default: the checkpoint's torch_dtype.")
FLAGS.mark_flag_as_required("hf_dir")
FLAGS.mark_flag_as_required("out_dir")


def main(argv: list[str]) -> None:
    """Run the conversion named by the flags."""
    del argv
    out = convert_hf_to_orbax(FLAGS.hf_dir, FLAGS.out_dir, dtype=FLAGS.dtype)
    print(f"wrote {out}")
