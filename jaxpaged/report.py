"""The one writer of benchmark results: JSON, Markdown tables and PNG plots, each only where a path is given.

Every command that reports numbers writes through `write_results` (its flags,
``--json_out``, ``--md_out`` and ``--plot_dir``, are `jaxpaged.cli.output_flags`);
tables are rendered by `markdown_table`, figures saved by `save_figure`. Plot
functions (`jaxpaged.sim.plots`, `jaxpaged.bench.offline.plots`) only build and
return a `Figure`; nothing else in the package saves one.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.figure import Figure

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def memory_environment(thp_setting: Path = THP_SETTING) -> dict[str, str | None]:
    """What decides whether the process's buffers sit on huge pages (CPU steps run ~10% faster when they do).

    `transparent_hugepage` is the kernel's mode (`always`, `madvise` or `never`;
    None off Linux); `GLIBC_TUNABLES` is the environment variable, where
    `glibc.malloc.hugetlb=1` makes malloc ask for huge pages in `madvise` mode
    (docs/benchmarks/throughput.md, "The step-level targets").
    """
    mode = None
    if thp_setting.is_file():
        text = thp_setting.read_text()
        mode = text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()
    return {"transparent_hugepage": mode, "GLIBC_TUNABLES": os.environ.get("GLIBC_TUNABLES")}


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align``: a letter per column, ``l`` or ``r`` (default: first left, rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or any(len(row) != len(header) for row in rows):
        raise ValueError(f"every row needs {len(header)} cells and align {len(header)} letters")
    lines = [markdown_row(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
    return "\n".join(lines + [markdown_row(row) for row in rows])


def metrics_table(columns: Mapping[str, Mapping[str, Any]], rows: Sequence[tuple[str, str, str]],
                  extra_rows: Sequence[Sequence[Any]] = ()) -> str:
    """A metric-by-column Markdown table: ``rows`` are (label, key, format) looked up in each of ``columns``
    (header -> its values); a missing, None or NaN value shows as "-", and a row of nothing but "-" is left out."""
    def cell(values: Mapping[str, Any], key: str, fmt: str) -> str:
        value = values.get(key)
        return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)

    table = [[label, *(cell(values, key, fmt) for values in columns.values())] for label, key, fmt in rows]
    return markdown_table(["metric", *columns], [*(r for r in table if any(c != "-" for c in r[1:])), *extra_rows])


def markdown_row(cells: Sequence[Any]) -> str:
    """One row of a `markdown_table` (a command streaming rows as they are measured prints these)."""
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def measured_on() -> dict[str, Any]:
    """Where and when a result is written: the UTC time, the processor and host, CPUs, the load average."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.processor() or platform.machine(), "host": platform.node(),
            "cpus": os.cpu_count(), "load_average": os.getloadavg()}


def write_outputs(result: Mapping, table: str | None, json_out: str | None, md_out: str | None) -> None:
    """Write ``result`` (plus `measured_on` and `memory_environment`) as JSON to ``json_out`` and ``table`` as
    Markdown to ``md_out``.

    None skips either.
    """
    result = {"measured_on": measured_on(), "memory_environment": memory_environment()} | dict(result)
    for path, text in ((json_out, json.dumps(result, indent=2)), (md_out, None if table is None else table + "\n")):
        if path and text is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)


def save_figure(fig: Figure, path: str | Path, dpi: float | str = "figure") -> Path:
    """Save a matplotlib figure as PNG at ``path`` (its folder made; ``dpi`` default: the figure's own)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi, format="png")
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close(fig)  # a figure made through pyplot stays registered (and in memory) until closed
    return path


def write_results(result: Mapping, table: str | None, *, json_out: str | None = None, md_out: str | None = None,
                  plot_dir: str | Path | None = None, plots: Mapping[str, Callable[[], Figure]] | None = None,
                  echo: bool = True) -> list[Path]:
    """Print ``table`` (``echo``), write ``result`` / ``table`` where given, and save each plot into ``plot_dir``.

    ``plots`` maps a file name to a function that builds its figure (called
    only when there is a ``plot_dir``, so no figure is drawn for nothing); each
    is saved by `save_figure`. The plots written are returned (none without ``plot_dir``).
    """
    if echo and table:
        print(table)
    write_outputs(result, table, json_out or None, md_out or None)
    written = []
    if plot_dir and plots:
        for name, build in plots.items():
            written.append(save_figure(build(), Path(plot_dir) / name))
            print(f"wrote {written[-1]}")
    return written
