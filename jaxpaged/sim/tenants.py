"""Two tenants under overload on the simulated device: one sends 10x the other's rate; each tenant's TTFT and TPOT
(p50, p99) under each scheduling policy (fcfs, priority, fair), and the light tenant alone (the bound's base).

    python -m jaxpaged.sim.tenants --model=llama3-8b --profile=h200-141gb
    python -m jaxpaged.sim.tenants --cpu_model=tiny --prompt_len=64 --output_len=16   # real CPU steps

Every step goes through `Engine.step()` (no decode fast-forward), so the fair policy's counters see every
token. Under ``priority`` the light tenant's requests have priority 0 and the heavy tenant's 1 (the operator
giving the small tenant precedence); under ``fair`` both count as their own tenant.
"""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
from absl import app, flags

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler.policy import SCHEDULING_POLICIES
from jaxpaged.sim.driver import make_sim_engine
from jaxpaged.sim.scenario import Deployment

TENANTS = ("light", "heavy")


@dataclasses.dataclass(frozen=True)
class TenantLoad:
    """The two tenants' traffic: Poisson arrivals, fixed prompt and output lengths."""

    light_rate: float = 2.0  # requests/s
    heavy_factor: float = 10.0  # the heavy tenant's rate over the light one's
    duration_s: float = 60.0
    prompt_len: int = 1024
    output_len: int = 128
    seed: int = 0

    def arrivals(self) -> list[tuple[float, str]]:
        """(arrival time, tenant), sorted by time."""
        rng = random.Random(self.seed)
        out = []
        for tenant, rate in (("light", self.light_rate), ("heavy", self.light_rate * self.heavy_factor)):
            t = rng.expovariate(rate) if rate > 0 else self.duration_s
            while t < self.duration_s:
                out.append((t, tenant))
                t += rng.expovariate(rate)
        return sorted(out)


def run_policy(deployment: Deployment, load: TenantLoad, policy: str) -> dict:
    """Serve ``load`` under ``policy`` in simulated time; each tenant's TTFT/TPOT p50/p99 (seconds) and count."""
    config = dataclasses.replace(deployment.engine_config(), scheduling_policy=policy)
    engine, clock = make_sim_engine(config, deployment.model_config, deployment.cost_model())
    return serve_load(engine, clock, load, deployment.model_config.vocab_size)


def run_policy_cpu(model: str, load: TenantLoad, policy: str, **engine_options) -> dict:
    """The same on this machine's CPU with a real model, in real time (arrivals when the wall clock reaches
    them; a step in progress delays them, as a server's would). Run the load once before, unmeasured, so no
    compile falls inside the measured run."""
    from jaxpaged.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model=model, scheduling_policy=policy, **engine_options))
    start = engine.clock()
    return serve_load(engine, lambda: engine.clock() - start, load, engine.model_config.vocab_size,
                      time_offset=start)


def serve_load(engine, clock, load: TenantLoad, vocab: int, time_offset: float = 0.0) -> dict:
    """Step ``engine`` through ``load``'s arrivals on ``clock`` (``advance_to`` when it has one, else waits)."""
    import time
    params = SamplingParams(temperature=0, max_tokens=load.output_len, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    rng = np.random.default_rng(load.seed)
    pending = load.arrivals()[::-1]
    tenant_of, results = {}, {t: {"ttft": [], "tpot": []} for t in TENANTS}
    while pending or engine.has_unfinished_requests():
        while pending and pending[-1][0] <= clock():
            arrival, tenant = pending.pop()
            rid = f"{tenant}-{len(tenant_of)}"
            tenant_of[rid] = tenant
            prompt = rng.integers(1, vocab, load.prompt_len).tolist()  # distinct prompts: no prefix hits
            engine.add_request(rid, prompt, params, arrival_time=arrival + time_offset, tenant=tenant,
                               priority=0 if tenant == "light" else 1)
        if not engine.has_unfinished_requests():
            if hasattr(clock, "advance_to"):
                clock.advance_to(pending[-1][0])
            else:
                time.sleep(max(pending[-1][0] - clock(), 0.0))
            continue
        for out in engine.step():
            results[tenant_of[out.request_id]]["ttft"].append(out.metrics.ttft)
            if out.metrics.tpot is not None:
                results[tenant_of[out.request_id]]["tpot"].append(out.metrics.tpot)
    summary = {}
    for tenant, r in results.items():
        summary[tenant] = {"requests": len(r["ttft"])} | {
            f"{name}_{q}": float(np.percentile(r[name], q)) if r[name] else None
            for name in ("ttft", "tpot") for q in (50, 99)}
    return summary


FLAGS = flags.FLAGS
flags.DEFINE_string("model", "llama3-8b", "model shape")
flags.DEFINE_string("profile", "h200-141gb", "simulated device")
flags.DEFINE_float("light_rate", 2.0, "the light tenant's requests/s")
flags.DEFINE_float("heavy_factor", 10.0, "the heavy tenant's rate over the light one's")
flags.DEFINE_float("duration_s", 60.0, "simulated seconds of arrivals")
flags.DEFINE_integer("prompt_len", 1024, "prompt tokens")
flags.DEFINE_integer("output_len", 128, "generated tokens")
flags.DEFINE_integer("max_num_seqs", 256, "batch slots")
flags.DEFINE_string("output_json", None, "write the results here")
flags.DEFINE_string("cpu_model", None, "run on this machine's CPU with this model (e.g. tiny) in real time, "
                    "instead of the simulated device")


def main(argv) -> None:
    """Each policy on the same arrivals; prints a Markdown table."""
    del argv
    deployment = Deployment(model=FLAGS.model, profile=FLAGS.profile, max_num_seqs=FLAGS.max_num_seqs)
    load = TenantLoad(FLAGS.light_rate, FLAGS.heavy_factor, FLAGS.duration_s, FLAGS.prompt_len, FLAGS.output_len)
    if FLAGS.cpu_model:
        def run(load, policy):
            return run_policy_cpu(FLAGS.cpu_model, load, policy, max_num_seqs=FLAGS.max_num_seqs,
                                  max_model_len=load.prompt_len + load.output_len + 16)
    else:
        def run(load, policy):
            return run_policy(deployment, load, policy)
    if FLAGS.cpu_model:
        for warm in (load, dataclasses.replace(load, heavy_factor=0.0)):  # unmeasured: compiles every shape the
            run(warm, "fcfs")                                              # runs reach (cached per process)
    rows = {"fcfs, light alone": run(dataclasses.replace(load, heavy_factor=0.0), "fcfs")}
    rows |= {policy: run(load, policy) for policy in SCHEDULING_POLICIES}
    where = f"{FLAGS.cpu_model} on this CPU" if FLAGS.cpu_model else f"{FLAGS.model} on {FLAGS.profile}"
    print(f"{where}; light {load.light_rate}/s, heavy {load.light_rate * load.heavy_factor}/s,"
          f" {load.prompt_len}+{load.output_len} tokens, {load.duration_s:.0f} s of arrivals\n")
    print("| policy | tenant | requests | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (ms) | TPOT p99 (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for policy, summary in rows.items():
        for tenant, s in summary.items():
            if not s["requests"]:
                continue
            print(f"| {policy} | {tenant} | {s['requests']} | {s['ttft_50']:.3f} | {s['ttft_99']:.3f} | "
                  f"{1e3 * s['tpot_50']:.1f} | {1e3 * s['tpot_99']:.1f} |")
    if FLAGS.output_json:
        with open(FLAGS.output_json, "w") as f:
            json.dump({"load": dataclasses.asdict(load), "model": FLAGS.model, "profile": FLAGS.profile,
                       "results": rows}, f, indent=1)


if __name__ == "__main__":
    app.run(main)
