"""Convert a Hugging Face checkpoint or a GGUF file to a jaxpaged Orbax checkpoint.

    jaxpaged convert --model=/models/Llama-3.2-1B --out_dir=/ckpt/llama1b --dtype=bfloat16
    jaxpaged convert --model=data/models/SmolLM2-135M-Instruct.Q4_1.gguf --out_dir=/ckpt/smollm2

`jaxpaged.checkpoint.load_model(out_dir)` reloads it with no name mapping or dequantization; tokenizer files
are copied alongside (a GGUF's written as `tokenizer.json` and `tokenizer_config.json`). `--hf_dir` = `--model`.
"""

from __future__ import annotations

from absl import app

from jaxpaged.checkpoint import convert_hf_to_orbax
from jaxpaged.cli.flagset import FlagSet

FLAGS = FlagSet()
FLAGS.DEFINE_string("model", None, "Hugging Face checkpoint directory (config.json + safetensors) or GGUF file.")
FLAGS.DEFINE_alias("hf_dir", "model")
FLAGS.DEFINE_string("out_dir", None, "Directory for the Orbax checkpoint (created).")
FLAGS.DEFINE_enum("dtype", None, ["float32", "bfloat16", "float16"],
                  "Weight dtype to store; default: the checkpoint's torch_dtype.")
FLAGS.mark_flag_as_required("model")
FLAGS.mark_flag_as_required("out_dir")


def main(argv: list[str]) -> None:
    """Run the conversion named by the flags; a checkpoint that cannot be read is a usage error."""
    del argv
    try:
        out = convert_hf_to_orbax(FLAGS.model, FLAGS.out_dir, dtype=FLAGS.dtype)
    except ValueError as error:
        raise app.UsageError(f"--model={FLAGS.model}: {error}") from None
    print(f"wrote {out}")
