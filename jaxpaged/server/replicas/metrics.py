"""The replicas' engine metrics on the ingress's `/metrics`: each replica's series, labelled by replica."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

REPLICA_LABEL = "replica"


class _Families:
    """A collector that yields fixed metric families."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        """The families, as given."""
        return self._families


def merge_replica_metrics(texts: dict[str, str]) -> str:
    """One exposition of several replicas' metrics (``replica id -> Prometheus text``): a family's samples
    from every replica under one HELP/TYPE header, each with a ``replica`` label."""
    families: dict[str, Metric] = {}
    for replica, text in texts.items():
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type,
                                                        family.unit)
            merged.samples.extend(s._replace(labels={**s.labels, REPLICA_LABEL: replica}) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry).decode()
