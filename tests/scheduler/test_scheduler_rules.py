"""The scheduler's batching rules, checked step by step against their plain statement.

A real `Scheduler` and `KVCacheManager` (no device) serve a random workload
with shared prefixes on a pool small enough to force preemption. The "model"
is a pure function of (request, position), so whatever the scheduler does
(chunked prefill, prefix hits, preemption and recompute) every request must
end with exactly the tokens that function gives, and every step must respect:

- the token budget and the running-set bound;
- a running sequence continues exactly where it stopped, and never past the
  tokens it has;
- a step samples a sequence exactly when it reaches its last known token, and
  a decoding sequence gets one token per step;
- waiting requests are admitted first come, first served, except that one
  whose prefix a running sequence is computing right now waits a step for it;
- nothing leaks: every block is free once everything has finished.
"""

import numpy as np
import pytest

from jaxpaged.cache import KVCacheManager
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.scheduler import ModelOutput, Scheduler, SchedulerConfig
from jaxpaged.sequence import Request, Sequence

BS = 4
VOCAB = 997


def model_token(request_id: str, position: int) -> int:
    """The token the fake model samples after `position` tokens of `request_id` (independent of batching)."""
    return (hash((request_id, position)) % VOCAB + VOCAB) % VOCAB


def _requests(rng, count: int) -> list[Request]:
    shared = rng.integers(0, VOCAB, 3 * BS + 1).tolist()
    requests = []
    for i in range(count):
        prompt = (shared if i % 2 == 0 else []) + rng.integers(0, VOCAB, int(rng.integers(1, 25))).tolist()
        params = SamplingParams(temperature=0, max_tokens=int(rng.integers(1, 16)), ignore_eos=True)
        request = Request(f"r{i}", prompt, params, arrival_time=0.0, arrival_order=i,
                          max_len=len(prompt) + params.max_tokens, base_seed=i)
        request.seqs = [Sequence(request, list(prompt), 0)]
        requests.append(request)
    return requests


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("max_num_seqs,max_num_batched_tokens", [(6, 24), (3, 64)])
def test_every_step_follows_the_batching_rules_and_outputs_ignore_batching(seed, max_num_seqs,
                                                                            max_num_batched_tokens):
    rng = np.random.default_rng(seed)
    kv = KVCacheManager(24, BS)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=max_num_seqs,
                                          max_num_batched_tokens=max_num_batched_tokens), kv)
    requests = _requests(rng, 16)
    for request in requests:
        scheduler.add_request(request)
    finished, steps = [], 0
    while scheduler.running or scheduler.waiting:
        before = {seq.seq_id: seq.num_computed_tokens for seq in scheduler.running}
        waiting_order = [seq.request.arrival_order for seq in scheduler.waiting]
        out = scheduler.schedule()
        steps += 1
        assert sum(out.num_tokens) <= max_num_batched_tokens
        assert len(scheduler.running) <= max_num_seqs and out.num_seqs <= max_num_seqs
        preempted = {seq.seq_id for r in out.preempted for seq in r.seqs}
        admitted = []
        for seq, start, n, samples in zip(out.seqs, out.starts, out.num_tokens, out.samples):
            assert n >= 1 and start + n <= seq.num_tokens
            if seq.seq_id in before and seq.seq_id not in preempted:
                assert start == before[seq.seq_id], "a running sequence continues where it stopped"
                if before[seq.seq_id] >= seq.num_prompt_tokens:
                    assert n == 1, "a decoding sequence gets one token per step"
            else:
                admitted.append(seq.request.arrival_order)
            assert samples == (start + n == seq.num_tokens)
        newest = max((order for order in admitted if order in waiting_order), default=-1)
        for seq in scheduler.waiting:  # first come, first served: an older request left waiting must
            if seq.request.arrival_order < newest:  # be waiting for a prefix a running sequence computes
                assert kv.match_prefix(seq.token_ids).num_pending_tokens > 0
        tokens = [model_token(seq.request.request_id, start + n) for seq, start, n in
                  zip(out.seqs, out.starts, out.num_tokens)]
        scheduler.update_from_output(out, ModelOutput(token_ids=np.array(tokens, dtype=np.int64),
                                                      logprobs=np.zeros(len(tokens))), 0.0)
        finished += scheduler.take_finished_requests()
        kv.check_invariants()
    assert scheduler.num_preemptions > 0, "the pool is meant to force preemption"
    assert kv.stats.num_used_blocks == 0
    assert sorted(r.request_id for r in finished) == sorted(r.request_id for r in requests)
    for request in requests:
        (seq,) = request.finished_seqs
        prompt_len = len(request.prompt_token_ids)
        assert seq.finish_reason == "length"
        expected = [model_token(request.request_id, prompt_len + j) for j in range(request.params.max_tokens)]
        assert seq.token_ids[prompt_len:] == expected
