"""Where one jitted step's time goes: a `jax.profiler` trace, attributed to the code that emitted each op.

The trace of a step names every executed XLA op (fusion, dot, scatter, ...) with
its duration. The compiled HLO carries, for each op, the Python call stack that
traced it (`stack_frame_id` into the module's StackFrames/FileLocations/
FunctionNames tables). Walking that stack from the innermost frame outward to the
first function named in `CATEGORIES` files the op's time under a part of the
step: attention, the K/V write, the MLP, and so on. Only leaf ops count (a
conditional or a loop's own span holds its body's ops), so nothing is counted
twice.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
import tempfile
from pathlib import Path

import jax

from jaxpaged.runner import ModelRunner
from jaxpaged.runner.step_input import StepInput

# innermost-first: the first of these function names on an op's stack decides its part
CATEGORIES = {
    "write_layer_kv": "K/V write",
    "paged_attention": "attention",
    "Attention._qkv": "q/k/v projection + RoPE",
    "Attention.__call__": "o projection",
    "MLP.__call__": "MLP",
    "RMSNorm.__call__": "RMSNorm",
    "DecoderModel.logits": "LM head",
    "Embed.__call__": "embedding",
    "sample": "sampling",
}
OTHER = "other"

_TABLE_HEADERS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")
_ENTRY = re.compile(r"^(\d+) (.*)$")
_FIELD = re.compile(r"(\w+)=(\d+)")
_OP = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*stack_frame_id=(\d+)")


def _tables(hlo_text: str) -> dict[str, dict[int, str]]:
    """The HLO module's stack tables: table name -> id -> raw entry text."""
    tables: dict[str, dict[int, str]] = {}
    current = None
    for line in hlo_text.splitlines():
        if line in _TABLE_HEADERS:
            current = tables.setdefault(line, {})
            continue
        match = _ENTRY.match(line) if current is not None else None
        if match:
            current[int(match.group(1))] = match.group(2)
        elif current is not None and line.strip():
            current = None
    return tables


def op_call_stacks(hlo_text: str) -> dict[str, list[str]]:
    """Each HLO op's traced Python call stack as function names, innermost first."""
    tables = _tables(hlo_text)
    functions = {i: text.strip('"') for i, text in tables.get("FunctionNames", {}).items()}
    locations = {i: dict((k, int(v)) for k, v in _FIELD.findall(text))
                 for i, text in tables.get("FileLocations", {}).items()}
    frames = {i: dict((k, int(v)) for k, v in _FIELD.findall(text))
              for i, text in tables.get("StackFrames", {}).items()}

    def stack(frame_id: int) -> list[str]:
        names, seen = [], set()
        while frame_id in frames and frame_id not in seen:
            seen.add(frame_id)
            location = locations.get(frames[frame_id]["file_location_id"], {})
            names.append(functions.get(location.get("function_name_id"), "?"))
            frame_id = frames[frame_id]["parent_frame_id"] - 1  # parents count from 1 more (0: no parent)
        return names

    stacks = {}
    for line in hlo_text.splitlines():
        match = _OP.match(line)
        if match:
            stacks[match.group(1)] = stack(int(match.group(2)))
    return stacks


def category_of(call_stack: list[str]) -> str:
    """The part of the step an op belongs to: the innermost function of its stack named in CATEGORIES."""
    for name in call_stack:
        if name in CATEGORIES:
            return CATEGORIES[name]
    return OTHER


def leaf_op_seconds(trace_events: list[dict], op_names: set[str]) -> dict[str, float]:
    """Total seconds of each named op over the trace, counting only leaves (spans holding no other op)."""
    spans = collections.defaultdict(list)
    for event in trace_events:
        if event.get("ph") == "X" and event.get("name") in op_names:
            spans[(event["pid"], event["tid"])].append((float(event["ts"]), float(event["dur"]), event["name"]))
    totals: dict[str, float] = collections.defaultdict(float)
    for thread in spans.values():
        thread.sort()
        for i, (start, duration, name) in enumerate(thread):
            next_start = thread[i + 1][0] if i + 1 < len(thread) else float("inf")
            if next_start >= start + duration:  # nothing starts inside it: a leaf
                totals[name] += duration * 1e-6
    return dict(totals)


def profile_step(runner: ModelRunner, step: StepInput, repeats: int = 3) -> dict[str, float]:
    """Seconds per part of the step (CATEGORIES' values and "other"), per run, from a trace of `repeats` runs.

    The step is compiled and run once first, so the trace holds execution only.
    """
    stacks = op_call_stacks(runner.lower(step).compile().as_text())
    runner.execute(step)
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir):
            for _ in range(repeats):
                runner.execute(step)
        trace_file = max(Path(trace_dir).rglob("*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
        events = json.loads(gzip.decompress(trace_file.read_bytes()))["traceEvents"]
    parts: dict[str, float] = collections.defaultdict(float)
    for name, seconds in leaf_op_seconds(events, set(stacks)).items():
        parts[category_of(stacks[name])] += seconds / repeats
    return dict(parts)
