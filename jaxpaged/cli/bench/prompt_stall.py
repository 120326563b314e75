"""How long one huge prompt stalls the other streams: the longest gap between a stream's outputs.

    jaxpaged bench prompt-stall --prompt_chars=20000000 --repeats=3

One greedy stream decodes on an `AsyncEngine` (the server's engine loop, no
HTTP) while, 0.3 s in, another client adds a text prompt of `--prompt_chars`
characters, far over `max_model_len`. Reported: the median over repeats of
the stream's longest gap between two outputs, with and without the huge
prompt, side by side (docs/BENCHMARKS.md, "A huge prompt and the other streams").
"""

from __future__ import annotations

import asyncio
import statistics
import time


from jaxpaged.cli.flagset import FlagSet
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.async_engine import AsyncEngine

FLAGS = FlagSet()
PROMPT_CHARS = FLAGS.DEFINE_integer("prompt_chars", 20_000_000, "characters of the huge prompt")
REPEATS = FLAGS.DEFINE_integer("repeats", 3, "rounds with and without the huge prompt")
MAX_TOKENS = FLAGS.DEFINE_integer("max_tokens", 600, "tokens the measured stream decodes")
MODEL = FLAGS.DEFINE_string("model", "tiny", "a shipped model config name, a config JSON or a checkpoint directory")
FLAGS.register_validator("prompt_chars", lambda v: v > 0, message="--prompt_chars must be > 0")
FLAGS.register_validator("repeats", lambda v: v > 0, message="--repeats must be > 0")
FLAGS.register_validator("max_tokens", lambda v: 1 < v <= 900, message="--max_tokens must be in [2, 900]")


async def longest_gap(async_engine: AsyncEngine, tag: str, huge: bool) -> float:
    """The stream's longest gap between two outputs (seconds), with or without a huge prompt added meanwhile."""
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS.value, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    stream = await async_engine.add_request(tag, [1, 2, 3], params)

    async def add_huge():
        await asyncio.sleep(0.3)
        try:
            await async_engine.add_request(tag + "-huge", "y" * PROMPT_CHARS.value, SamplingParams(max_tokens=2))
        except ValueError:
            pass  # refused: longer than max_model_len

    other = asyncio.ensure_future(add_huge()) if huge else None
    times = [time.perf_counter() async for _ in stream]
    if other is not None:
        await other
    return max(b - a for a, b in zip(times, times[1:]))


def main(argv):
    """Measure, then print one Markdown table."""
    del argv
    engine = Engine(EngineConfig(model=MODEL.value, num_blocks=256, max_model_len=1024))
    async_engine = AsyncEngine(engine)
    async_engine.start()

    async def rounds():
        await longest_gap(async_engine, "warm-up", False)
        gaps = {False: [], True: []}
        for r in range(REPEATS.value):
            for huge in (False, True):
                gaps[huge].append(await longest_gap(async_engine, f"r{r}-{huge}", huge))
        return gaps

    gaps = asyncio.run(rounds())
    async_engine.shutdown()
    quiet, loud = statistics.median(gaps[False]), statistics.median(gaps[True])
    print(f"| stream alone: longest gap | with a {PROMPT_CHARS.value:,}-character prompt | ratio |")
    print("|---|---|---|")
    print(f"| {quiet * 1e3:.0f} ms | {loud * 1e3:.0f} ms | {loud / quiet:.2f}x |")
