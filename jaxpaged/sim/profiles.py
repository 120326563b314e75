"""Device profiles for the roofline cost model: peak FLOP/s, memory bandwidth, per-step overhead.

GPU figures are vendor datasheet peaks (dense bf16/fp16 tensor-core FLOP/s,
HBM bandwidth) for the SXM parts, so simulated times are a roofline: an upper
bound on speed that real kernels approach but do not reach. The "cpu" profile
is fitted to measured steps of the small config on this machine
(`jaxpaged calibrate` writes `cpu_profile.json` beside this file).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

CPU_PROFILE_PATH = Path(__file__).resolve().parent / "cpu_profile.json"


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What the cost model needs to know about one accelerator.

    `padded_shapes` says the device runs jaxpaged's bucketed CPU step (token
    and row counts padded to powers of two, the chunked attention walking each
    group's rows to the group's longest context: `CostModel._padded_work`)
    rather than an ideal ragged kernel.

    `phase_overlap` says whether a phase's compute and memory traffic overlap
    (time = max of the two: the roofline, right for GPUs) or follow each other
    (time = their sum: a CPU running XLA, whose attention gathers and
    matmuls run one after another). Without overlap the weights'
    read, the same every step, is part of `step_overhead_s`.
    """

    name: str
    peak_flops: float  # FLOP/s
    memory_bandwidth: float  # bytes/s
    step_overhead_s: float  # fixed cost per step: launches, host round trip
    memory_bytes: int  # device memory, for capacity planning
    padded_shapes: bool = False
    per_seq_overhead_s: float = 0.0  # host work per scheduled sequence (input layout)
    attention_flops: float | None = None  # effective FLOP/s of attention if unlike the GEMMs' (CPU)
    phase_overlap: bool = True
    # tensor parallelism: bytes/s one device sends (and receives) to its peers, one direction, and the
    # fixed cost of one all-reduce (launch and synchronisation); None: no interconnect to model
    interconnect_bandwidth: float | None = None
    interconnect_latency_s: float = 0.0

    @property
    def attn_flops_rate(self) -> float:
        """FLOP/s the attention phase runs at."""
        return self.attention_flops or self.peak_flops

    def __post_init__(self):
        for field in ("peak_flops", "memory_bandwidth"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")
        if self.step_overhead_s < 0 or self.per_seq_overhead_s < 0:
            raise ValueError("overheads must be non-negative")


GB = 10**9
GIB = 1 << 30

# Datasheet peaks (dense, no sparsity). Step overhead: a typical CUDA-graph decode step's launch and
# host round trip, a few tens of microseconds; an assumption, not a measurement.
# Interconnect: NVLink per GPU, one direction (NVLink 3 on A100: 600 GB/s both ways; NVLink 4 on
# H100/H200: 900 GB/s both ways), all GPUs of a node on one NVSwitch. All-reduce latency: ~10 us for
# the small messages of a decode step (NCCL's typical small-message figure); an assumption.
GPU_PROFILES = {
    "a100-80gb": DeviceProfile("a100-80gb", peak_flops=312e12, memory_bandwidth=2.039e12,
                               step_overhead_s=50e-6, memory_bytes=80 * GIB,
                               interconnect_bandwidth=300e9, interconnect_latency_s=10e-6),
    "h100-80gb": DeviceProfile("h100-80gb", peak_flops=989e12, memory_bandwidth=3.35e12,
                               step_overhead_s=50e-6, memory_bytes=80 * GIB,
                               interconnect_bandwidth=450e9, interconnect_latency_s=10e-6),
    "h200-141gb": DeviceProfile("h200-141gb", peak_flops=989e12, memory_bandwidth=4.8e12,
                                step_overhead_s=50e-6, memory_bytes=141 * GB,
                                interconnect_bandwidth=450e9, interconnect_latency_s=10e-6),
}


def save_profile(profile: DeviceProfile, path: Path = CPU_PROFILE_PATH, **extra) -> None:
    """Write a profile (plus free-form provenance fields) as JSON."""
    path.write_text(json.dumps({**dataclasses.asdict(profile), **extra}, indent=2) + "\n")


def load_profile_file(path: Path) -> DeviceProfile:
    """Read a profile written by `save_profile`, ignoring provenance fields."""
    data = json.loads(Path(path).read_text())
    names = {f.name for f in dataclasses.fields(DeviceProfile)}
    return DeviceProfile(**{k: v for k, v in data.items() if k in names})


def get_profile(name: str) -> DeviceProfile:
    """A profile by name: one of `GPU_PROFILES`, "cpu" (the calibrated file), or a JSON path."""
    if name in GPU_PROFILES:
        return GPU_PROFILES[name]
    if name == "cpu":
        if not CPU_PROFILE_PATH.exists():
            raise ValueError("no calibrated cpu profile: run `jaxpaged calibrate` first")
        return load_profile_file(CPU_PROFILE_PATH)
    if Path(name).suffix == ".json":
        return load_profile_file(Path(name))
    raise ValueError(f"unknown device profile {name!r}; known: {sorted(GPU_PROFILES) + ['cpu']}")
