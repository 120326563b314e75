"""How full the KV blocks held by running sequences really are (the PagedAttention paper's waste)."""

from __future__ import annotations


def kv_slot_usage(engine) -> tuple[int, int]:
    """``(filled, reserved)`` KV slots now, across the pool.

    ``reserved`` is every slot of every block held by a sequence (for the
    contiguous baseline: whole reservations). ``filled`` counts slots holding a
    computed token, each physical block once however many sequences share it.
    Waste is ``1 - filled / reserved``.
    """
    kv = engine.kv
    bs = kv.block_size
    filled: dict[int, int] = {}
    for seq in engine.scheduler.running:
        if seq.seq_id not in kv:
            continue
        num_computed = seq.num_computed_tokens  # computed, or being computed by a step in flight
        for index, block in enumerate(kv.block_table(seq.seq_id)):
            in_block = min(bs, max(0, num_computed - index * bs))
            if in_block > filled.get(block, 0):
                filled[block] = in_block
    return sum(filled.values()), kv.stats.num_used_blocks * bs
