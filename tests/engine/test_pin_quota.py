"""`PinLedger` (jaxpaged/engine/pin_quota.py) against a plain model of its rules, and `Engine.pin_prefix` refusing
past a tenant's quota or the pool's size with nothing pinned."""

import random

import pytest

from jaxpaged.engine.pin_quota import PinLedger, PinQuota, PinQuotaError

BLOCK = 4


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_ledger_matches_a_plain_model_of_the_rules():
    rng = random.Random(0)
    clock = Clock()
    ledger = PinLedger(clock, BLOCK, max_total_blocks=12)
    quotas = {"a": PinQuota("a", max_pins=2, max_pinned_blocks=6), "b": PinQuota("b", max_pinned_blocks=8),
              "c": PinQuota("c", max_pins=1)}
    model: dict[tuple, tuple[str, int, float]] = {}  # prefix -> (owner, blocks, deadline)
    pinned_calls = []
    refused = accepted = 0
    for _ in range(3000):
        clock.now += rng.choice([0, 0, 0.5, 2])
        owner = rng.choice("abc")
        salt = rng.choice([None, "s"])
        tokens = [rng.randrange(3)] * rng.randrange(0, 4 * BLOCK)
        ttl = rng.choice([0, 1, 3, 10])
        blocks = len(tokens) // BLOCK
        key = (salt, tuple(tokens[:blocks * BLOCK]))
        live = {k: v for k, v in model.items() if v[2] > clock.now}
        others = {k: v for k, v in live.items() if k != key}
        mine = [v for v in others.values() if v[0] == owner]
        q = quotas[owner]
        over = ttl > 0 and blocks > 0 and (
            sum(v[1] for v in others.values()) + blocks > 12
            or (q.max_pins is not None and len(mine) + 1 > q.max_pins)
            or (q.max_pinned_blocks is not None and sum(v[1] for v in mine) + blocks > q.max_pinned_blocks))
        calls_before = len(pinned_calls)
        try:
            ledger.pin(tokens, salt, ttl, q, lambda: pinned_calls.append(1) or 7)
        except PinQuotaError:
            assert over
            assert len(pinned_calls) == calls_before  # refused before anything was pinned
            refused += 1
            continue
        assert not over
        accepted += 1
        model = live
        if ttl <= 0:
            model.pop(key, None)
        elif blocks:
            model[key] = (owner, blocks, clock.now + ttl)
        for name in "abc":
            mine = [v for v in model.values() if v[0] == name]
            assert ledger.held(name) == (len(mine), sum(v[1] for v in mine))
    assert refused > 100 and accepted > 100  # both sides of every bound were exercised


def test_engine_refuses_a_pin_past_the_quota_and_pins_nothing():
    from jaxpaged.engine import Engine, EngineConfig
    engine = Engine(EngineConfig(model="tiny", num_blocks=8, block_size=4, max_model_len=32))
    quota = PinQuota("alice", max_pins=1)
    assert engine.pin_prefix(list(range(1, 9)), 60, quota=quota) == 0
    with pytest.raises(PinQuotaError, match="max_pins=1"):
        engine.pin_prefix(list(range(11, 19)), 60, quota=quota)
    with pytest.raises(PinQuotaError, match="server's bound of 8"):
        engine.pin_prefix(list(range(1, 30)), 60)  # 7 blocks + alice's 2 > the pool's 8
    assert engine.pin_prefix(list(range(11, 19)), 60, quota=PinQuota("bob")) == 0
    assert len(engine.kv._pool.pins) == 4  # alice's two hashes and bob's two: the refused pins left nothing
