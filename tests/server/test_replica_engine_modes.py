"""`EngineReplica` in both engine modes, driven directly with a stand-in Serve context and ingress (no Ray cluster).

`test_replicas.py` runs replicas on a real Ray Serve cluster, but only with the
default `engine_core="process"`; here the same actor class runs each mode in
this process: the request's tokens are `LLM.generate`'s on the same weights,
the KV events it reports to the ingress describe exactly the blocks the
replica's engine caches, and its metrics count the tokens it generated.
"""

import asyncio
import types

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jaxpaged.cache.events import AllBlocksCleared, BlockStored
from jaxpaged.engine import EngineConfig
from jaxpaged.llm import LLM
from jaxpaged.sampling_params import SamplingParams

pytest.importorskip("ray.serve", reason="the replicas need the serve extra (ray[serve])")

from jaxpaged.server.replicas import replica as replica_module  # noqa: E402 - after the extra's check
from jaxpaged.server.replicas.messages import Accepted  # noqa: E402
from jaxpaged.server.request_stream import EngineDeadError  # noqa: E402

CONFIG = EngineConfig(model="tiny", num_blocks=32, max_model_len=256)
PROMPT = list(range(1, 41))  # two full blocks and a partial one
PARAMS = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


class FakeIngress:
    """The ingress deployment's handle: ``report.remote(report)`` keeps each report and answers None."""

    def __init__(self):
        self.reports = []
        self.report = types.SimpleNamespace(remote=self._take)

    async def _take(self, report):
        self.reports.append(report)


def _serve_stand_in(ingress: FakeIngress):
    context = types.SimpleNamespace(app_name="app", replica_id=types.SimpleNamespace(
        unique_id="r1", to_full_id_str=lambda: "app#EngineReplica#r1"))
    return types.SimpleNamespace(get_replica_context=lambda: context,
                                 get_deployment_handle=lambda name, app_name: ingress)


@pytest.fixture(scope="module")
def reference_tokens():
    llm = LLM(model="tiny", num_blocks=32, max_model_len=256)
    return llm.generate([PROMPT], PARAMS, use_tqdm=False)[0].outputs[0].token_ids


@pytest.mark.parametrize("engine_core", ["thread", "process"])
def test_a_replica_serves_reports_its_blocks_and_counts_its_tokens(monkeypatch, reference_tokens, engine_core):
    ingress = FakeIngress()
    monkeypatch.setattr(replica_module, "serve", _serve_stand_in(ingress))

    async def scenario():
        replica = replica_module.EngineReplica.__new__(replica_module.EngineReplica)
        await replica.__init__(CONFIG, ingress_deployment="ingress", report_interval_s=0.01,
                               engine_core=engine_core)
        try:
            answers = [a async for a in replica.generate("a", PROMPT, PARAMS)]
            view = await replica.inspect()
            while not any(isinstance(e, BlockStored) for r in ingress.reports for e in r.events):
                await asyncio.sleep(0.01)  # the report task's next batch
            replica.check_health()
            return answers, view, await replica.metrics_text()
        finally:
            replica._reporter.cancel()
            replica.client.shutdown()
            replica.__del__()  # what Serve's stop runs: the core process (if any) drains and exits

    answers, view, metrics = asyncio.run(scenario())
    assert isinstance(answers[0], Accepted) and answers[-1].finished
    assert answers[-1].outputs[0].token_ids == reference_tokens
    first = ingress.reports[0]
    assert first.first and isinstance(first.events[0], AllBlocksCleared)
    stored = {h for r in ingress.reports for e in r.events if isinstance(e, BlockStored) for h in e.block_hashes}
    assert stored == view.cached_hashes and len(stored) == 2  # the prompt's two full blocks, as the engine has them
    generated = {s.name: s.value for f in text_string_to_metric_families(metrics) for s in f.samples}
    assert generated["jaxpaged:generation_tokens_total"] == PARAMS.max_tokens


def test_a_core_client_shut_down_ends_its_open_streams_and_closes_its_socket(monkeypatch):
    """`CoreClient.shutdown` (the API server's lifespan calls it from a worker thread): a stream still open
    ends with EngineDeadError instead of waiting forever, and the ZeroMQ context is closed (left open, its
    garbage collection at exit blocked this module's pytest process in `Context.term()`)."""
    monkeypatch.setattr(replica_module, "serve", _serve_stand_in(FakeIngress()))

    async def scenario():
        replica = replica_module.EngineReplica.__new__(replica_module.EngineReplica)
        await replica.__init__(CONFIG, ingress_deployment="ingress", engine_core="process")
        try:
            long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
            stream = await replica.client.add_request("long", PROMPT, long)
            await stream.__anext__()
            await asyncio.to_thread(replica.client.shutdown)
            with pytest.raises(EngineDeadError, match="shutting down"):
                async for _ in stream:
                    pass
            return replica.client.is_running, replica.client._ctx.closed
        finally:
            replica._reporter.cancel()
            replica.__del__()

    assert asyncio.run(scenario()) == (False, True)
