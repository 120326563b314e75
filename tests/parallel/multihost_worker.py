"""One process of the multi-host check: tiny at tensor_parallel_size=4, tokens to a JSON file.

    multihost_worker.py --out=tokens.json                     # one process, 4 host devices
    multihost_worker.py --out=p0.json --coordinator_address=localhost:PORT --num_processes=2 --process_id=0
    multihost_worker.py --out=p1.json --coordinator_address=localhost:PORT --num_processes=2 --process_id=1

Only process 0 builds the requests; the others receive them through
`broadcast_object`, as a multi-host server's processes would.
"""

import json

from absl import app, flags

from jaxpaged import distributed

OUT = flags.DEFINE_string("out", None, "where to write this process's tokens")


def _requests():
    shared = list(range(40, 61))
    out = []
    for i in range(6):
        tail = [(7 * i + 3 * j) % 250 for j in range(3 + 2 * i)]
        params = ({"n": 2, "temperature": 0.9, "seed": i} if i % 3 == 2 else {"temperature": 0})
        out.append({"id": f"r{i}", "prompt": (shared if i % 2 == 0 else []) + tail,
                    "params": dict(params, max_tokens=8 + i, ignore_eos=True)})
    return out


def main(argv):
    del argv
    distributed.initialize_from_flags()
    import jax

    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.sampling_params import SamplingParams

    requests = distributed.broadcast_object(_requests() if distributed.is_leader() else None)
    engine = Engine(EngineConfig(model="tiny", block_size=4, num_blocks=24, tensor_parallel_size=4))
    for r in requests:
        engine.add_request(r["id"], r["prompt"], SamplingParams(**r["params"]))
    tokens = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                tokens[out.request_id] = [c.token_ids for c in out.outputs]
    try:  # a host tier reads whole blocks on one host: refused across processes
        Engine(EngineConfig(model="tiny", block_size=4, num_blocks=24, tensor_parallel_size=4,
                            host_cache_bytes=1 << 20))
        host_tier_refused = False
    except ValueError as e:
        host_tier_refused = "single-process only" in str(e)
    with open(OUT.value, "w") as f:
        json.dump({"process_index": jax.process_index(), "process_count": jax.process_count(),
                   "devices": len(jax.devices()), "local_devices": len(jax.local_devices()),
                   "preemptions": engine.scheduler.num_preemptions, "tokens": tokens,
                   "host_tier_refused": host_tier_refused}, f)


if __name__ == "__main__":
    app.run(main)
