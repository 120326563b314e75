"""Tensor parallelism on forced host CPU devices: step time and memory per device for TP = 1, 2, 4.

    python scripts/bench_tensor_parallel.py --model=small --sizes=1,2,4 --json_out=out/tp.json

XLA_FLAGS defaults to 4 forced host devices (set it yourself for more). The CPU
gains no speed from splitting: the "devices" share the same cores and memory,
and every all-reduce is a copy. What the run shows is memory per device and
the cost of the collectives; GPU figures wait for a device.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import dataclasses  # noqa: E402
import json  # noqa: E402

from absl import app, flags  # noqa: E402

from jaxpaged import distributed  # noqa: E402
from jaxpaged.bench.offline.tensor_parallel import bench_tensor_parallel, markdown_table  # noqa: E402
from jaxpaged.config import load_config  # noqa: E402

MODEL = flags.DEFINE_string("model", "small", "model config name or path")
SIZES = flags.DEFINE_list("sizes", ["1", "2", "4"], "tensor-parallel sizes, run side by side")
DECODE_BATCH = flags.DEFINE_integer("decode_batch", 32, "sequences in the decode step")
CONTEXT = flags.DEFINE_integer("decode_context", 512, "context length of each decoding sequence")
PREFILL = flags.DEFINE_integer("prefill_len", 512, "tokens in the prefill step")
BLOCK_SIZE = flags.DEFINE_integer("block_size", 16, "tokens per KV block")
ROUNDS = flags.DEFINE_integer("rounds", 10, "timed rounds (each runs every size once); medians reported")
JSON_OUT = flags.DEFINE_string("json_out", None, "write results here as JSON")
flags.register_validator("sizes", lambda sizes: all(s.isdigit() and int(s) >= 1 for s in sizes),
                         "--sizes must be positive integers, e.g. 1,2,4")
for _flag in ("decode_batch", "decode_context", "prefill_len", "block_size", "rounds"):
    flags.register_validator(_flag, lambda value: value >= 1, f"--{_flag} must be >= 1")


def main(argv):
    del argv
    distributed.initialize_from_flags()
    import jax
    config = load_config(MODEL.value)
    results = bench_tensor_parallel(config, [int(s) for s in SIZES.value], decode_batch=DECODE_BATCH.value,
                                    context=CONTEXT.value, prefill_len=PREFILL.value,
                                    block_size=BLOCK_SIZE.value, rounds=ROUNDS.value)
    print(f"{config.name}: decode {DECODE_BATCH.value} x {CONTEXT.value} context, prefill {PREFILL.value} "
          f"tokens; {len(jax.devices())} {jax.default_backend()} devices")
    print(markdown_table(results))
    if JSON_OUT.value and distributed.is_leader():
        with open(JSON_OUT.value, "w") as f:
            json.dump({"model": config.name, "decode_batch": DECODE_BATCH.value, "decode_context": CONTEXT.value,
                       "prefill_len": PREFILL.value, "block_size": BLOCK_SIZE.value, "rounds": ROUNDS.value,
                       "devices": len(jax.devices()), "results": [dataclasses.asdict(r) for r in results]},
                      f, indent=2)


if __name__ == "__main__":
    app.run(main)
