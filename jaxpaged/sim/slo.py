"""Service-level objectives of a simulated run: which requests met their TTFT and TBT targets, and goodput.

A request meets the TTFT objective when its time to first token is at most
`ttft_s`, and the TBT objective when its time between tokens is at most
`tbt_s`; which statistic of its gaps between consecutive output tokens counts
is `tbt_stat`: "mean" (TPOT, as DistServe states its objective), "p90" (the
request's 90th-percentile gap; Mooncake states its TBT objective on P90) or
"max" (its longest stall). A request with one output token has no gap and
meets the TBT objective. Attainment is the fraction of requests meeting an
objective; goodput the requests meeting both per second of the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

TBT_STATS = ("mean", "p90", "max")


class TimedRecord(Protocol):
    """What the objectives read of a request's record (simulated seconds)."""

    ttft: float
    tpot: float | None
    tbt_p90: float | None
    tbt_max: float | None


@dataclasses.dataclass(frozen=True)
class SLO:
    """Targets for time to first token and time between tokens (seconds), and the TBT statistic judged."""

    ttft_s: float
    tbt_s: float
    tbt_stat: str = "p90"

    def __post_init__(self):
        if not (self.ttft_s > 0 and self.tbt_s > 0):
            raise ValueError(f"SLO targets must be positive, got ttft_s={self.ttft_s!r}, tbt_s={self.tbt_s!r}")
        if self.tbt_stat not in TBT_STATS:
            raise ValueError(f"tbt_stat must be one of {list(TBT_STATS)}, got {self.tbt_stat!r}")

    def tbt(self, record: TimedRecord) -> float | None:
        """The record's TBT statistic (None: fewer than two output tokens)."""
        return {"mean": record.tpot, "p90": record.tbt_p90, "max": record.tbt_max}[self.tbt_stat]

    def meets_ttft(self, record: TimedRecord) -> bool:
        return record.ttft <= self.ttft_s

    def meets_tbt(self, record: TimedRecord) -> bool:
        tbt = self.tbt(record)
        return tbt is None or tbt <= self.tbt_s

    def meets(self, record: TimedRecord) -> bool:
        """Both objectives."""
        return self.meets_ttft(record) and self.meets_tbt(record)


@dataclasses.dataclass(frozen=True)
class Attainment:
    """Fractions of requests meeting each objective and both; goodput in requests per second."""

    ttft: float
    tbt: float
    both: float
    goodput_rps: float


def attainment(records: Sequence[TimedRecord], slo: SLO, duration_s: float) -> Attainment:
    """The objectives over `records` of a run lasting `duration_s` (first arrival to last finish)."""
    if not records:
        return Attainment(0.0, 0.0, 0.0, 0.0)
    n = len(records)
    ttft = sum(slo.meets_ttft(r) for r in records)
    tbt = sum(slo.meets_tbt(r) for r in records)
    both = sum(slo.meets(r) for r in records)
    return Attainment(ttft / n, tbt / n, both / n, both / duration_s if duration_s > 0 else 0.0)
