"""Simulated serving: the real scheduler and KV cache manager over a roofline cost model.

- `profiles`: device profiles (A100/H100/H200 datasheet peaks, the calibrated "cpu").
- `cost_model`: FLOPs and bytes of one step, per phase, and its predicted time.
- `runner`: `SimulatedRunner` (the engine's device backend) and `SimClock`.
- `driver`: serve a workload in simulated time; `scenario`: build a simulated
  deployment and sweep request rates for the sustainable one.
- `gc_tuning`: `collect_cycles_rarely`, the cycle-collector setting long simulations run under.
- `calibrate`, `validate`: fit the "cpu" profile and check it against measured steps.
- `serving_sweep`, `routing_sweep`, `disagg_sweep`, `hybrid_kv`, `speculation`, `tenants`: what the
  ``jaxpaged simulate`` commands run, with their tables.
- `workloads`, `traces`: the synthetic workloads and Mooncake traces that the simulator and the benchmarks serve.
"""
