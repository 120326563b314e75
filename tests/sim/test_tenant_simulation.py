"""The two-tenant benchmark on the simulated device (jaxpaged/sim/tenants.py), in simulated time: under
overload the fair and priority policies keep the light tenant's TTFT near its alone value, where fcfs does not."""

import dataclasses

from jaxpaged.sim.scenario import Deployment
from jaxpaged.sim.tenants import TenantLoad, run_policy


def test_fair_keeps_the_light_tenant_near_alone_and_fcfs_does_not():
    deployment = Deployment(model="llama3-8b", profile="h200-141gb", max_num_seqs=8)
    load = TenantLoad(light_rate=4.0, heavy_factor=10.0, duration_s=3.0, prompt_len=512, output_len=128)
    alone = run_policy(deployment, dataclasses.replace(load, heavy_factor=0.0), "fcfs")["light"]
    runs = {policy: run_policy(deployment, load, policy) for policy in ("fcfs", "priority", "fair")}
    assert all(r["light"]["requests"] == alone["requests"] for r in runs.values())  # same arrivals, all served
    assert runs["fcfs"]["light"]["ttft_99"] > 10 * alone["ttft_99"]  # the heavy backlog reaches the light tenant
    for policy in ("priority", "fair"):
        assert runs[policy]["light"]["ttft_99"] < runs["fcfs"]["light"]["ttft_99"] / 3, policy
