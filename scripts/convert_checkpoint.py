"""Convert a Hugging Face Llama checkpoint to a jaxpaged Orbax checkpoint.

    python scripts/convert_checkpoint.py --hf_dir=/models/Llama-3.2-1B --out_dir=/ckpt/llama1b --dtype=bfloat16

The output reloads with `jaxpaged.checkpoint.load_model(out_dir)` without the
safetensors name mapping; tokenizer files are copied alongside.
"""

from __future__ import annotations

from absl import app, flags

from jaxpaged.checkpoint import convert_hf_to_orbax

flags.DEFINE_string("hf_dir", None, "Hugging Face checkpoint directory (config.json + safetensors).")
flags.DEFINE_string("out_dir", None, "Directory for the Orbax checkpoint (created).")
flags.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                  "Weight dtype to store; default: the checkpoint's torch_dtype.")
flags.mark_flags_as_required(["hf_dir", "out_dir"])


def main(argv: list[str]) -> None:
    """Run the conversion named by the flags."""
    del argv
    out = convert_hf_to_orbax(flags.FLAGS.hf_dir, flags.FLAGS.out_dir, dtype=flags.FLAGS.dtype)
    print(f"wrote {out}")


if __name__ == "__main__":
    app.run(main)
