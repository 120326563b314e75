"""The persistent batch lays out every step exactly as `build_step_input` does from the cache manager's tables.

A real scheduler and cache manager (no device) serve a workload with chunked
prefill, prefix hits, n > 1 forks (copy-on-write) and preemption; after every
schedule the runner's `InputBatch`, kept up to date only by the scheduler's
changes, must give the same arrays as laying the step out from scratch.
"""

import numpy as np
import pytest

from jaxpaged.cache import KVCacheManager
from jaxpaged.runner import InputBatch
from jaxpaged.runner.step_input import ScheduledSeq, build_step_input
from jaxpaged.sampling_params import SamplingParams, sequence_seed
from jaxpaged.scheduler import TOKEN_ON_DEVICE, ModelOutput, Scheduler, SchedulerConfig
from jaxpaged.sequence import Request, Sequence

BS = 4
FIELDS = ("token_ids", "positions", "slot_mapping", "block_tables", "context_lens", "query_start", "query_lens",
          "logits_indices", "temperature", "top_k", "top_p", "seeds", "counters", "order")


def _requests(rng):
    shared = rng.integers(0, 200, 13).tolist()
    requests = []
    for i in range(24):
        prompt = (shared if i % 3 == 0 else []) + rng.integers(0, 200, int(rng.integers(1, 30))).tolist()
        n = 3 if i % 7 == 2 else 1
        params = SamplingParams(n=n, temperature=float(i % 3) / 2, top_k=-1 if i % 2 else 10, top_p=0.9,
                                seed=i, max_tokens=int(rng.integers(1, 20)), ignore_eos=True)
        request = Request(f"r{i}", prompt, params, arrival_time=0.0, arrival_order=i,
                          max_len=len(prompt) + params.max_tokens, base_seed=1000 + i)
        request.fork_pending = n > 1 and len(prompt) > 1
        request.seqs = [Sequence(request, list(prompt), k) for k in range(1 if request.fork_pending else n)]
        requests.append(request)
    return requests


def _reference(out, kv) -> list[ScheduledSeq]:
    batch, at = [], 0
    for seq, start, n in zip(out.seqs, out.starts, out.num_tokens):
        request = seq.request
        p = request.params
        batch.append(ScheduledSeq(out.token_ids[at:at + n], start, kv.block_table(seq.seq_id),
                                  temperature=p.temperature, top_k=p.top_k, top_p=p.top_p,
                                  seed=sequence_seed(request.base_seed, seq.index),
                                  sample_index=start + n - len(request.prompt_token_ids)))
        at += n
    return batch


@pytest.mark.parametrize("min_decode_rows", [1, 2], ids=["rows>=1", "rows>=2"])  # 2: a CPU bfloat16 runner's
@pytest.mark.parametrize("async_steps", [False, True], ids=["sync", "async"])
def test_persistent_batch_equals_a_fresh_layout_every_step(async_steps, min_decode_rows):
    rng = np.random.default_rng(3)
    kv = KVCacheManager(40, BS)
    scheduler = Scheduler(SchedulerConfig(max_num_seqs=12, max_num_batched_tokens=40), kv)
    for request in _requests(rng):
        scheduler.add_request(request)
    rows = InputBatch(BS, num_rows=2, min_decode_rows=min_decode_rows)  # tiny at first: rows and columns grow
    in_flight, steps, devices, one_decode = None, 0, 0, 0
    while scheduler.running or scheduler.waiting or in_flight:
        if in_flight is not None and not async_steps:
            scheduler.update_from_output(*in_flight)
            in_flight = None
        out = scheduler.schedule()
        rows.apply(out)
        if out.seqs:
            step = rows.prepare(out)
            expected = build_step_input(_reference(out, kv), BS, min_decode_rows=min_decode_rows)
            device = expected.token_ids == TOKEN_ON_DEVICE
            devices += int(device.sum())
            np.testing.assert_array_equal(step.token_src_rows >= 0, device)
            expected.token_ids[device] = 0
            for field in FIELDS:
                np.testing.assert_array_equal(getattr(step, field), getattr(expected, field), err_msg=field)
            assert step.layout == expected.layout
            # the token a row's last step sampled is read from that same row
            rows_of_seqs = [rows.row_of(seq_id) for seq_id in out.seq_ids]
            np.testing.assert_array_equal(step.sample_rows[step.order], rows_of_seqs)
            steps += 1
            decodes = sum(n == 1 for n in out.num_tokens)
            one_decode += decodes == 1 and step.layout.num_decode_seqs == min_decode_rows
        result = ModelOutput(token_ids=rng.integers(0, 200, out.num_seqs), logprobs=np.zeros(out.num_seqs))
        if in_flight is not None:
            scheduler.update_from_output(*in_flight)
        in_flight = (out, result, 0.0) if out.seqs else None
        kv.check_invariants()
    assert steps > 20 and scheduler.num_preemptions > 0 and kv.stats.num_cow_copies > 0
    assert one_decode > 0  # a step with one decode, padded to the minimum
    rows.apply(scheduler.schedule())  # rows of the last finished sequences are freed by the next schedule
    assert rows.num_rows_in_use == 0
    assert (devices > 0) == async_steps  # only asynchronous steps take inputs from the device
    assert kv.stats.num_used_blocks == 0
