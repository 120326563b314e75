"""The order in which `pytest -n 2 --dist loadfile` hands test modules to its workers: longest first.

xdist gives each worker one module at a time and, by default, takes modules in
decreasing number of tests. The suite's longest modules have few tests (one
live server, one subprocess, one real model), so that order starts them last,
and the run ends with one worker alone on a two-minute module while the other
idles. Handing out the longest modules first (the classic longest-processing-
time rule) leaves only short modules for the end, where they even out.

`LONGEST_MODULES` comes from module times of partial cold-cache runs of
2026-12-02 on a shared 2-core machine, plus the `--durations` of the
full run before them, longest first; a full quiet run should refine it. A
module not listed keeps xdist's own rule (more tests first), after the listed
ones. Re-measure with `pytest -n 2 --dist loadfile --durations=0` when a module
grows past the last listed one.

`SAME_WORKER` puts modules that share expensive session fixtures into one
work unit (`make_scheduler`, xdist's `pytest_xdist_make_scheduler` hook in
tests/conftest.py), so one worker builds those fixtures once.
"""

from __future__ import annotations

import collections

LONGEST_MODULES = [
    "tests/pretrained/test_smollm2.py",
    "tests/pretrained/test_real_model_references.py",
    "tests/parallel/test_tensor_parallel.py",
    "tests/kernels/test_ragged_paged_attention_mgpu.py",
    "tests/structured/test_structured_server.py",
    "tests/server/test_request_limits.py",
    "tests/kernels/test_chunked_xla_attention.py",
    "tests/checkpoint/test_checkpoint_gguf.py",
    "tests/server/test_replicas.py",
    "tests/kv_transfer/test_disagg_replicas.py",
    "tests/kernels/test_ragged_paged_attention.py",
    "tests/server/test_openai_server.py",
    "tests/server/test_http_fuzz.py",
    "tests/parallel/test_multihost.py",
]


# Modules that share session fixtures worth minutes: one work unit, so one worker loads them once. The two
# pretrained modules share a live server on the real model, transformers' model of it and its tokenizer
# (tests/pretrained/conftest.py); split over two workers, each loaded all three.
SAME_WORKER = {
    "tests/pretrained/test_smollm2.py": "tests/pretrained",
    "tests/pretrained/test_real_model_references.py": "tests/pretrained",
}


def make_scheduler(config, log):
    """xdist's `--dist loadfile` scheduler with the `SAME_WORKER` modules in one work unit; None (xdist's own
    scheduler) for any other distribution mode."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFixtureScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            return SAME_WORKER.get(module, module)

    return SharedFixtureScheduling(config, log)


def longest_first(items: list) -> list:
    """`items` (collected tests) regrouped module by module: listed modules in their order, then the others
    by decreasing number of tests (xdist's own rule), each module's tests in their collected order."""
    by_module: dict[str, list] = collections.defaultdict(list)
    for item in items:
        by_module[item.nodeid.split("::", 1)[0]].append(item)
    rank = {module: i for i, module in enumerate(LONGEST_MODULES)}
    order = sorted(by_module, key=lambda m: (rank.get(m, len(rank)), -len(by_module[m])))
    return [item for module in order for item in by_module[module]]
