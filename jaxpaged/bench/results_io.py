"""Where a benchmark script's results go: JSON and a Markdown table, each only where a path is given."""

from __future__ import annotations

import json
from pathlib import Path


def write_outputs(result: dict, table: str, json_out: str | None, md_out: str | None) -> None:
    """Write ``result`` as JSON to ``json_out`` and ``table`` as Markdown to ``md_out`` (None: skipped)."""
    for path, text in ((json_out, json.dumps(result, indent=2)), (md_out, table + "\n")):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
