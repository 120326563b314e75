"""The engine core's off-loop compile queue: checks run on a worker, results come back in arrival order."""

from __future__ import annotations

import threading
import time

import pytest

from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.core.compiling import PendingCompiles
from jaxpaged.server.core.process import _Command
from jaxpaged.server.request_stream import params_to_dict
from jaxpaged.structured import StructuredOutputsParams
from tests.server.live_server import WAIT_S


def _add(request_id: str, regex: str | None) -> _Command:
    params = SamplingParams(structured_outputs=None if regex is None else StructuredOutputsParams(regex=regex))
    return _Command({"op": "add", "id": request_id, "prompt": [1, 2], "params": params_to_dict(params)},
                    b"client", 7)


def _wait_ready(pending: PendingCompiles) -> list:
    deadline, out = time.monotonic() + WAIT_S, []
    while pending and time.monotonic() < deadline:
        out += pending.ready()
        time.sleep(0.01)
    return out


def test_checks_run_off_the_caller_and_come_back_in_order_with_their_errors():
    release = threading.Event()
    threads = set()

    def validate(prompt, params):
        threads.add(threading.current_thread().name)
        release.wait(WAIT_S)
        if params.structured_outputs.regex == "(":
            raise ValueError("structured_outputs.regex does not compile")

    pending = PendingCompiles(validate)
    assert not PendingCompiles.needs(_add("plain", None).record) and PendingCompiles.needs(_add("a", "x").record)
    for request_id, regex in (("a", "x+"), ("bad", "("), ("c", "y")):
        pending.submit(_add(request_id, regex))
    assert pending and pending.ready() == []  # nothing is done while the worker is held
    assert [c.record["id"] for c in pending.drop(lambda c: c.record["id"] == "c")] == ["c"]
    release.set()
    results = _wait_ready(pending)
    assert [(c.record["id"], type(e).__name__ if e else None) for c, e in results] == [("a", None),
                                                                                        ("bad", "ValueError")]
    assert not pending and threading.current_thread().name not in threads


def test_the_engine_check_compiles_the_constraint():
    from jaxpaged.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model="tiny", block_size=16, num_blocks=32))
    pending = PendingCompiles(engine.validate_prompt)
    pending.submit(_add("ok", "[a-z]{2}"))
    pending.submit(_add("bad", "[a-"))
    results = _wait_ready(pending)
    assert results[0][1] is None
    with pytest.raises(ValueError, match="structured_outputs.regex does not compile"):
        raise results[1][1]
