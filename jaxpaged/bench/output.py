"""Where a benchmark script's results go: JSON and a Markdown table, each only where a path is given."""

from __future__ import annotations

import json
import os
from pathlib import Path

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def memory_environment(thp_setting: Path = THP_SETTING) -> dict[str, str | None]:
    """What decides whether the process's buffers sit on huge pages (CPU steps run ~10% faster when they do).

    `transparent_hugepage` is the kernel's mode (`always`, `madvise` or `never`;
    None off Linux); `GLIBC_TUNABLES` is the environment variable, where
    `glibc.malloc.hugetlb=1` makes malloc ask for huge pages in `madvise` mode
    (docs/BENCHMARKS.md, "The step-level targets").
    """
    mode = None
    if thp_setting.is_file():
        text = thp_setting.read_text()
        mode = text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()
    return {"transparent_hugepage": mode, "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES")}


def write_outputs(result: dict, table: str, json_out: str | None, md_out: str | None) -> None:
    """Write ``result`` (plus `memory_environment`) as JSON to ``json_out`` and ``table`` as Markdown to ``md_out``.

    None skips either.
    """
    result = {"memory_environment": memory_environment()} | result
    for path, text in ((json_out, json.dumps(result, indent=2)), (md_out, table + "\n")):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
