"""How long one huge prompt stalls the other streams (`jaxpaged bench prompt-stall`; what it measures: its help)."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time

from jaxpaged.bench.options import option
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.report import markdown_table
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.async_engine import AsyncEngine


@dataclasses.dataclass(frozen=True)
class PromptStallOptions:
    """The huge prompt, the measured stream, and the rounds."""

    prompt_chars: int = option(20_000_000, "characters of the huge prompt", at_least=1)
    repeats: int = option(3, "rounds with and without the huge prompt", at_least=1)
    max_tokens: int = option(600, "tokens the measured stream decodes")


async def longest_gap(async_engine: AsyncEngine, tag: str, *, max_tokens: int, huge_prompt_chars: int | None) -> float:
    """The stream's longest gap between two outputs (seconds); with ``huge_prompt_chars``, a prompt that long
    is added by another client 0.3 s in (and refused: longer than ``max_model_len``)."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    stream = await async_engine.add_request(tag, [1, 2, 3], params)

    async def add_huge():
        await asyncio.sleep(0.3)
        try:
            await async_engine.add_request(tag + "-huge", "y" * huge_prompt_chars, SamplingParams(max_tokens=2))
        except ValueError:
            pass  # refused: longer than max_model_len

    other = asyncio.ensure_future(add_huge()) if huge_prompt_chars else None
    times = [time.perf_counter() async for _ in stream]
    if other is not None:
        await other
    return max(b - a for a, b in zip(times, times[1:]))


def measure_prompt_stall(engine_config, *, options: PromptStallOptions) -> tuple[dict, str]:
    """On an `AsyncEngine` over a fresh engine of ``engine_config``: a warm-up stream, then ``options.repeats``
    rounds of the stream alone and with the huge prompt, alternating; the gaps, their medians, a table."""
    from jaxpaged.engine import Engine
    async_engine = AsyncEngine(Engine(engine_config))
    repeats, max_tokens, prompt_chars = options.repeats, options.max_tokens, options.prompt_chars

    async def rounds():
        await longest_gap(async_engine, "warm-up", max_tokens=max_tokens, huge_prompt_chars=None)
        for r in range(repeats):
            for huge in (False, True):
                gaps[huge].append(await longest_gap(async_engine, f"r{r}-{huge}", max_tokens=max_tokens,
                                                    huge_prompt_chars=prompt_chars if huge else None))

    gaps: dict[bool, list[float]] = {False: [], True: []}
    async_engine.start()
    try:
        asyncio.run(rounds())
    finally:
        async_engine.shutdown()
    quiet, loud = statistics.median(gaps[False]), statistics.median(gaps[True])
    table = markdown_table(["stream alone: longest gap", f"with a {prompt_chars:,}-character prompt", "ratio"],
                           [[f"{quiet * 1e3:.0f} ms", f"{loud * 1e3:.0f} ms", f"{loud / quiet:.2f}x"]], align="lll")
    return {"prompt_chars": prompt_chars, "max_tokens": max_tokens,
            "longest_gap_s": {"alone": gaps[False], "with_huge_prompt": gaps[True]},
            "median_alone_s": quiet, "median_with_huge_prompt_s": loud}, table
