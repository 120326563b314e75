"""Roofline cost of one engine step: FLOPs and bytes per phase against a device profile.

A step computes `n` new tokens for each scheduled sequence that already has
`c` tokens of context in the KV pool. Two phases, each taking
`max(FLOPs / peak_flops, bytes / bandwidth)`, plus per-step and per-sequence overheads
(a profile without `phase_overlap`, the CPU's, adds the two instead of taking the max):

- dense (the linear layers and the LM head): `2 * P_layers` FLOPs per token,
  `2 * vocab * hidden` per sequence for its last token's logits; every weight
  is read once per step (the embedding table is gathered, not read).
- attention: `4 * num_heads * head_dim` FLOPs per layer for each (query, key)
  pair (QK^T and PV); each sequence reads the K/V of its whole context
  (`c + n` tokens) once and writes the K/V of its `n` new tokens.

Activations are not counted (small next to weights and KV at serving shapes).

Tensor parallelism over N devices (`tensor_parallel_size`) costs one device's
share: 1/N of the FLOPs and the weights, the KV of its KV heads (1/min(N,
kv_heads) of the pool: heads are replicated beyond that), plus two all-reduces
per layer (after attention's o-projection and the MLP's down-projection, as
Megatron splits them) of the step's `tokens x hidden` activations (2 bytes
each). A ring all-reduce of M bytes moves `2 (N - 1) / N * M` bytes through
each device's link, at `profile.interconnect_bandwidth`, plus
`interconnect_latency_s` per all-reduce; it is not overlapped with compute.
With `profile.padded_shapes` the step is costed as jaxpaged's bucketed CPU
step runs it (`jaxpaged/runner/step_input.py`, `pallas_kernels/chunked_xla.py`):
tokens and rows padded to powers of two; attention walks whole blocks up to
the longest context of its group (decode or prefill), for every row of the
group, and a prefill's query tiles each walk only as far as their last query.
Sliding-window layers (exact kernels only) read and attend to each query's last
W keys; the padded CPU shape still counts them as full layers.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable

from jaxpaged.config import DEFAULT_BLOCK_SIZE, ModelConfig
from jaxpaged.mathutils import cdiv
from jaxpaged.runner.step_input import step_buckets
from jaxpaged.sim.profiles import DeviceProfile
from pallas_kernels.chunked_xla import PREFILL_QUERY_TILE


@dataclasses.dataclass(frozen=True)
class StepCost:
    """FLOPs and bytes of one step, per phase, and the predicted time."""

    dense_flops: float
    dense_bytes: float
    attn_flops: float
    attn_bytes: float
    num_seqs: int
    time_s: float

    @property
    def flops(self) -> float:
        return self.dense_flops + self.attn_flops

    @property
    def bytes(self) -> float:
        return self.dense_bytes + self.attn_bytes


class CostModel:
    """Predicts step times for one model (at given weight and KV precisions) on one device."""

    def __init__(self, config: ModelConfig, profile: DeviceProfile, *,
                 weight_bytes_per_param: float = 2.0, kv_bytes_per_element: float = 2.0,
                 block_size: int = DEFAULT_BLOCK_SIZE, tensor_parallel_size: int = 1):
        """`weight_bytes_per_param`: 2 for bf16/fp16, 1 for fp8/int8, 0.5 for 4-bit.

        With `tensor_parallel_size` > 1 every figure is one device's (see the module docstring).
        """
        config.check_tensor_parallel(tensor_parallel_size)
        if tensor_parallel_size > 1 and not profile.interconnect_bandwidth:
            raise ValueError(f"profile {profile.name!r} has no interconnect_bandwidth; "
                             f"tensor_parallel_size={tensor_parallel_size} needs one")
        self.config = config
        self.profile = profile
        self.block_size = block_size
        self.tensor_parallel_size = tp = tensor_parallel_size
        h = config.hidden_size
        q_dim, kv_dim = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        layer_params = 2 * h * q_dim + 2 * h * kv_dim + 3 * h * config.intermediate_size
        self.layer_flops_per_token = 2.0 * config.num_layers * layer_params / tp
        self.lm_head_flops_per_seq = 2.0 * config.vocab_size * h / tp
        self.weight_bytes = (config.num_layers * layer_params + config.vocab_size * h) * weight_bytes_per_param / tp
        self.attn_flops_per_pair = 4.0 * config.num_layers * q_dim / tp
        self.kv_bytes_per_token = 2.0 * config.num_layers * kv_dim * kv_bytes_per_element / config.kv_shards(tp)
        # per step token: two ring all-reduces per layer of its hidden state (2-byte activations)
        self.allreduce_bytes_per_token = (0.0 if tp == 1 else
                                          2 * config.num_layers * 2 * (tp - 1) / tp * h * 2.0)
        self.allreduces_per_step = 0 if tp == 1 else 2 * config.num_layers
        # sliding-window layers per window (Gemma 3, Mistral): exact kernels read only the window
        self.sliding_layers = collections.Counter(w for w in config.layer_windows if w is not None)
        self.num_full_layers = config.num_layers - sum(self.sliding_layers.values())

    def step_cost(self, seqs: Iterable[tuple[int, int]]) -> StepCost:
        """Cost of a step computing `(num_new_tokens, num_context_tokens_before)` for each sequence."""
        seqs = list(seqs)
        if self.profile.padded_shapes:
            decodes = [c for n, c in seqs if n == 1]
            work = self._padded_work(len(decodes), max(decodes, default=0), [(n, c) for n, c in seqs if n > 1])
        elif self.sliding_layers:
            work = self._windowed_work(seqs)
        else:
            work = self._exact_work(seqs)
        dense_flops, attn_flops, attn_bytes = self._amounts(*work, kv_written=sum(n for n, _ in seqs))
        return StepCost(dense_flops, self.weight_bytes, attn_flops, attn_bytes, len(seqs),
                        self._seconds(dense_flops, attn_flops, attn_bytes, len(seqs), work[0]))

    def decode_step_time(self, num_seqs: int, total_context: int, max_context: int) -> float:
        """`step_time` of `num_seqs` one-token decodes over contexts summing to `total_context`.

        Equal, to the last bit, to `step_time([(1, c) for c in contexts])`; O(1),
        for the simulator's decode fast-forward.
        """
        if self.profile.padded_shapes:
            work = self._padded_work(num_seqs, max_context, [])  # O(1): only the longest context matters
        elif self.sliding_layers:
            raise ValueError("decode_step_time needs each context with sliding-window layers: use step_time")
        else:
            work = (num_seqs, num_seqs, total_context + num_seqs, total_context + num_seqs)
        return self._seconds(*self._amounts(*work, kv_written=num_seqs), num_seqs, work[0])

    def _amounts(self, tokens: int, rows: int, pairs: int, kv_read: int, *,
                 kv_written: int) -> tuple[float, float, float]:
        """Dense FLOPs, attention FLOPs and attention bytes of a step's token, row, pair and KV counts."""
        return (self.layer_flops_per_token * tokens + self.lm_head_flops_per_seq * rows,
                self.attn_flops_per_pair * pairs, self.kv_bytes_per_token * (kv_read + kv_written))

    def _seconds(self, dense_flops: float, attn_flops: float, attn_bytes: float, num_seqs: int,
                 num_tokens: int) -> float:
        p = self.profile
        if p.phase_overlap:
            phases = (max(dense_flops / p.peak_flops, self.weight_bytes / p.memory_bandwidth)
                      + max(attn_flops / p.attn_flops_rate, attn_bytes / p.memory_bandwidth))
        else:  # weights: a constant, inside step_overhead_s
            phases = dense_flops / p.peak_flops + attn_flops / p.attn_flops_rate + attn_bytes / p.memory_bandwidth
        return p.step_overhead_s + p.per_seq_overhead_s * num_seqs + phases + self.allreduce_time(num_tokens)

    def allreduce_time(self, num_tokens: int) -> float:
        """Seconds of one step's tensor-parallel all-reduces over `num_tokens` token rows (0 on one device)."""
        if self.allreduces_per_step == 0:
            return 0.0
        p = self.profile
        return (self.allreduce_bytes_per_token * num_tokens / p.interconnect_bandwidth
                + self.allreduces_per_step * p.interconnect_latency_s)

    def step_time(self, seqs: Iterable[tuple[int, int]]) -> float:
        """Predicted seconds for one step (see `step_cost`)."""
        return self.step_cost(seqs).time_s

    def copy_time(self, num_blocks: int) -> float:
        """Seconds to copy `num_blocks` KV blocks (copy-on-write): read and write each once."""
        return 2 * num_blocks * self.block_size * self.kv_bytes_per_token / self.profile.memory_bandwidth

    @staticmethod
    def _exact_work(seqs: list[tuple[int, int]]) -> tuple[int, int, int, int]:
        """Ideal ragged kernels: only real tokens, causal (query, key) pairs."""
        tokens = pairs = kv_read = 0
        for n, c in seqs:
            tokens += n
            pairs += n * c + n * (n + 1) // 2
            kv_read += c + n
        return tokens, len(seqs), pairs, kv_read

    def _windowed_work(self, seqs: list[tuple[int, int]]) -> tuple[int, int, float, float]:
        """`_exact_work` for a model with sliding-window layers, as layer-averaged pair and K/V counts.

        A sliding layer's query at position p sees min(p + 1, W) keys, and a
        sequence reads the keys from its first query's window on (vLLM's and the
        Pallas kernel's skipping); the per-layer counts are averaged over the
        layers, so the per-pair and per-token constants (all layers) apply unchanged.
        """
        tokens, rows, pairs, kv_read = self._exact_work(seqs)
        pairs *= self.num_full_layers
        kv_read *= self.num_full_layers
        for window, layers in self.sliding_layers.items():
            for n, c in seqs:
                capped = max(min(c + n, window) - c, 0)  # queries whose whole causal prefix fits the window
                pairs += layers * ((c + capped) * (c + capped + 1) // 2 - c * (c + 1) // 2 + (n - capped) * window)
                kv_read += layers * min(c + n, window - 1 + n)
        num_layers = self.num_full_layers + sum(self.sliding_layers.values())
        return tokens, rows, pairs / num_layers, kv_read / num_layers

    def _padded_work(self, num_decodes: int, max_decode_context: int,
                     prefill: list[tuple[int, int]]) -> tuple[int, int, int, int]:
        """jaxpaged's bucketed step: (tokens, rows, query-key pairs, K/V tokens read) as the chunked path runs it.

        `max_decode_context` is the longest decode's context before its token; `prefill` the
        prefill chunks' (new tokens, context before). Each group's loop walks whole
        blocks to its longest context for all its (bucketed) rows; prefill query
        tiles of `PREFILL_QUERY_TILE` rows stop at their last query's position.
        """
        bs = self.block_size
        decode_blocks = cdiv(max_decode_context + 1, bs) if num_decodes else 0
        max_blocks = max([decode_blocks] + [cdiv(n + c, bs) for n, c in prefill])
        b = step_buckets(num_decodes, len(prefill), sum(n for n, _ in prefill),
                         max((n for n, _ in prefill), default=0), max_blocks)
        decode_keys = bs * decode_blocks
        pairs = kv_read = b.num_decode_rows * decode_keys
        if prefill:
            prefill_keys = bs * max(cdiv(n + c, bs) for n, c in prefill)
            start = max(c for _, c in prefill)
            tile = min(PREFILL_QUERY_TILE, b.max_prefill_query_len)
            for t in range(cdiv(b.max_prefill_query_len, tile)):
                keys = min(prefill_keys, bs * cdiv(start + (t + 1) * tile, bs))
                pairs += b.num_prefill_rows * tile * keys
                kv_read += b.num_prefill_rows * keys
        return b.num_tokens, b.num_rows, pairs, kv_read
