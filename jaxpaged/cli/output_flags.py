"""`OutputFlags`: ``--json_out``, ``--md_out`` and ``--plot_dir`` on a command, written by the one writer.

The JSON records every flag the command ran with (``"flags"``), so a result says how to reproduce it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jaxpaged.cli.flagset import FlagSet
from jaxpaged.report import write_results

if TYPE_CHECKING:
    from matplotlib.figure import Figure

_UNSET = object()


class OutputFlags:
    """A command's output flags, and `write_results` behind them."""

    def __init__(self, fs: FlagSet, *, json_out: str | None = None, md_out: str | None = None,
                 plot_dir: Any = _UNSET) -> None:
        """Define the flags on ``fs`` with these defaults; ``--plot_dir`` only when ``plot_dir`` is given."""
        self._fs = fs
        self._json = fs.DEFINE_string("json_out", json_out, "write the results here as JSON")
        self._md = fs.DEFINE_string("md_out", md_out, "write the Markdown table here")
        self._plots = None if plot_dir is _UNSET else fs.DEFINE_string(
            "plot_dir", plot_dir, "write the PNG plots here ('' = none)")

    @property
    def plot_dir(self) -> Path | None:
        """Where plots go, or None when off."""
        return Path(self._plots.value) if self._plots is not None and self._plots.value else None

    def write(self, result: Mapping, table: str | None = None, *,
              plots: Mapping[str, Callable[[], Figure]] | None = None, echo: bool = True) -> list[Path]:
        """`write_results` to where the flags point (``plots``: file name -> a function building its figure), with
        the command's flags as ``"flags"``."""
        return write_results({"flags": self._fs.values.flag_values_dict()} | dict(result), table,
                             json_out=self._json.value, md_out=self._md.value, plot_dir=self.plot_dir, plots=plots,
                             echo=echo)
