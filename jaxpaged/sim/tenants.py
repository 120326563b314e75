"""Two tenants under overload on the simulated device: one sends 10x the other's rate; each tenant's TTFT and TPOT
(p50, p99) under each scheduling policy (fcfs, priority, fair), and the light tenant alone (the bound's base).

    jaxpaged simulate tenants --model=llama3-8b --profile=h200-141gb
    jaxpaged simulate tenants --cpu_model=tiny --prompt_len=64 --output_len=16   # real CPU steps

Every step goes through `Engine.step()` (no decode fast-forward), so the fair policy's counters see every
token. Under ``priority`` the light tenant's requests have priority 0 and the heavy tenant's 1 (the operator
giving the small tenant precedence); under ``fair`` both count as their own tenant.
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.report import markdown_table
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
    return serve_load(engine, clock, load, deployment.model_config.vocab_size, advance_to=clock.advance_to)


def run_policy_cpu(model: str, load: TenantLoad, policy: str, **engine_options) -> dict:
    """The same on this machine's CPU with a real model, in real time (arrivals when the wall clock reaches
    them; a step in progress delays them, as a server's would). The same engine first serves the load once on
    other prompts, unmeasured, so that every step shape the measured run reaches is compiled (or loaded from
    the compile cache) and traced in this engine before the clock starts; then its prefix cache is emptied."""
    from jaxpaged.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model=model, scheduling_policy=policy, **engine_options))
    vocab = engine.model_config.vocab_size
    start = engine.clock()
    serve_load(engine, lambda: engine.clock() - start, dataclasses.replace(load, seed=load.seed + 1), vocab,
               time_offset=start, request_prefix="warm-")
    engine.reset_prefix_cache()
    start = engine.clock()
    return serve_load(engine, lambda: engine.clock() - start, load, vocab, time_offset=start)


def serve_load(engine, clock, load: TenantLoad, vocab: int, time_offset: float = 0.0, *, advance_to=None,
               request_prefix: str = "") -> dict:
    """Step ``engine`` through ``load``'s arrivals on ``clock``; idle, it jumps to the next arrival with
    ``advance_to`` (a simulated clock's) or else waits for it. Request ids start with ``request_prefix``."""
    import time
    params = SamplingParams(temperature=0, max_tokens=load.output_len, ignore_eos=True, detokenize=False,
                            output_kind=RequestOutputKind.FINAL_ONLY)
    rng = np.random.default_rng(load.seed)
    pending = load.arrivals()[::-1]
    tenant_of, results = {}, {t: {"ttft": [], "tpot": []} for t in TENANTS}
    while pending or engine.has_unfinished_requests():
        while pending and pending[-1][0] <= clock():
            arrival, tenant = pending.pop()
            rid = f"{request_prefix}{tenant}-{len(tenant_of)}"
            tenant_of[rid] = tenant
            prompt = rng.integers(1, vocab, load.prompt_len).tolist()  # distinct prompts: no prefix hits
            engine.add_request(rid, prompt, params, arrival_time=arrival + time_offset, tenant=tenant,
                               priority=0 if tenant == "light" else 1)
        if not engine.has_unfinished_requests():
            if advance_to is not None:
                advance_to(pending[-1][0])
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


def run_tenants(deployment: Deployment, load: TenantLoad, *, cpu_model: str | None = None) -> dict[str, dict]:
    """The light tenant alone, then both tenants under each scheduling policy, on the same arrivals.

    With ``cpu_model`` every run is on this machine's CPU in real time, each on an engine warmed by an
    unmeasured run of its load (`run_policy_cpu`); else on the simulated device.
    """
    def run(load: TenantLoad, policy: str) -> dict:
        if cpu_model is None:
            return run_policy(deployment, load, policy)
        return run_policy_cpu(cpu_model, load, policy, max_num_seqs=deployment.max_num_seqs,
                              max_model_len=load.prompt_len + load.output_len + 16)

    alone = dataclasses.replace(load, heavy_factor=0.0)
    rows = {"fcfs, light alone": run(alone, "fcfs")}
    return rows | {policy: run(load, policy) for policy in SCHEDULING_POLICIES}


def tenants_table(rows: dict[str, dict]) -> str:
    """One row per policy and tenant that sent requests: TTFT and TPOT p50/p99."""
    return markdown_table(
        ["policy", "tenant", "requests", "TTFT p50 (s)", "TTFT p99 (s)", "TPOT p50 (ms)", "TPOT p99 (ms)"],
        [[policy, tenant, s["requests"], f"{s['ttft_50']:.3f}", f"{s['ttft_99']:.3f}", f"{1e3 * s['tpot_50']:.1f}",
          f"{1e3 * s['tpot_99']:.1f}"] for policy, summary in rows.items() for tenant, s in summary.items()
         if s["requests"]], align="llrrrrr")
