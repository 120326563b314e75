"""The decode side of a disaggregated deployment: a simulated runner with a host tier, as a decode engine has.

A real decode engine (`jaxpaged.kv_transfer`) lands the blocks it pulls in
its host tier, and admission restores them through the KV cache manager's one
entry point for blocks computed elsewhere (`plan_extension` -> `allocate_new`,
`jaxpaged.offload.KVTiers`), committing them as cached: the step computes only
the prompt's tail after its last full block (at least its last token, whose
logits give the first output token; vLLM's decode side recomputes it too).
The simulator's decode instances run that same path: their engines get a host
tier of one pool's worth (the builder's default for `kv_role="decode"`), and
`PulledKVRunner` is the block mover the tiers need, whose blocks carry no
data. Its block moves cost nothing on the simulated device: a pulled block's
time is on the link (`jaxpaged.sim.kv_link`), and a host-tier restore is
modelled as free as the device prefix hits are.

So the real rules hold on the decode side: a block the device cache or the
host tier holds is not pulled again, a pulled block is a prefix hit for the
requests after it, and a block held when the pull started but evicted before
admission is recomputed (`decode_recomputed_tokens`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from jaxpaged.config import ModelConfig
from jaxpaged.runner.protocol import RunnerCapabilities
from jaxpaged.sim.cost_model import CostModel
from jaxpaged.sim.runner import SimClock, SimulatedRunner

# a block that carries no data: one byte stands for it, so a host tier of N bytes holds N blocks
NO_DATA_BLOCK_SHAPE = (1,)


class _NoData:
    def __init__(self, num_blocks: int):
        self._num_blocks = num_blocks

    def result(self) -> list[None]:
        return [None] * self._num_blocks


class PulledKVRunner(SimulatedRunner):
    """`SimulatedRunner` whose blocks the lower tiers may move (`BlockMover`), at no cost and with no data."""

    capabilities = RunnerCapabilities(computes_logits=False, samples_under_token_masks=False, moves_blocks=True,
                                      predictable_steps=True, counts_device_time=True)
    kv_dtype = np.dtype(np.uint8)
    kv_block_shape = NO_DATA_BLOCK_SHAPE

    def __init__(self, config: ModelConfig, cost_model: CostModel, clock: SimClock, *, num_blocks: int):
        super().__init__(config, cost_model, clock, num_blocks=num_blocks)
        self.blocks_written = 0  # blocks restored from the host tier into the pool
        self.blocks_read = 0  # blocks offloaded from the pool to the host tier

    def start_read_blocks(self, block_ids: Sequence[int]) -> _NoData:
        """An offload: no data to copy."""
        self.blocks_read += len(block_ids)
        return _NoData(len(block_ids))

    def read_blocks(self, block_ids: Sequence[int]) -> list[None]:
        """An offload: no data to copy."""
        return self.start_read_blocks(block_ids).result()

    def write_blocks(self, block_ids: Sequence[int], blocks: Sequence[object]) -> None:
        """A restore (a pulled block or one offloaded earlier): free on the simulated device."""
        self.blocks_written += len(block_ids)
