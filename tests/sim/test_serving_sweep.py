"""`simulate serving`'s rate sweep: each point reported once, and the sustainable rate by its rule."""

from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.serving_sweep import SWEEP_HEADER, rate_sweep
from jaxpaged.sim.workloads import make_workload


def test_every_point_once_by_rate_and_the_sustainable_rate_is_the_highest_passing_one_below_every_failure():
    base = Deployment(model="tiny", profile="a100-80gb", kv_cache_bytes=10**6, block_size=4, max_num_seqs=4)
    requests = make_workload("chatbot", num_requests=30, seed=0, output_len=8)
    bound = 1e-3
    sweep = rate_sweep(base, requests, ["off"], [0.0, 5.0, 1e6], ttft_p99_bound_s=bound, refine=2, echo=False)
    points = sweep.results["off"]["points"]
    rates = [p["rate"] for p in points]
    assert rates == sorted(set(rates)) and {0.0, 5.0, 1e6} <= set(rates) and len(rates) == 5  # + 2 bisections
    assert len(sweep.rows) == 5 and all(len(row) == len(SWEEP_HEADER) for row in sweep.rows)
    swept = [p for p in points if p["rate"] > 0]
    best = None  # the rule, by hand: walk up the rates until the first that misses the bound
    for p in swept:
        if p["ttft_p99"] > bound:
            break
        best = p["rate"]
    assert sweep.results["off"]["sustainable_rate"] == best
    assert sweep.curves["prefix caching off"] == ([p["rate"] for p in swept], [p["ttft_p99"] for p in swept])
