"""Every figure is built by a plot function and saved by the one writer, as a PNG, into --plot_dir only."""

import functools
import struct

from jaxpaged.bench.offline.plots import plot_hit_rate_vs_capacity, plot_metric_vs_block_size
from jaxpaged.cli.flagset import FlagSet
from jaxpaged.cli.output_flags import OutputFlags
from jaxpaged.sim.plots import plot_sweep, plot_validation

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first chunk, right after the magic bytes)."""
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_functions_build_figures_the_writer_saves_as_pngs_into_plot_dir(tmp_path):
    ablation = [{"workload": w, "block_size": b, "kv_waste": b / 64} for w in ("chat", "rag") for b in (8, 16, 32)]
    replay = [{"policy": p, "capacity_tokens": c, "hit_rate": 0.1 * c / 1024} for p in ("lru", "sieve")
              for c in (256, 1024)] + [{"policy": "unbounded", "capacity_tokens": None, "hit_rate": 0.5}]
    built = []

    def recorded(build):
        return lambda: built.append(build) or build()

    plots = {"validation.png": recorded(lambda: plot_validation([0.01, 0.02], [0.011, 0.019], title="v")),
             "sweep.png": recorded(lambda: plot_sweep({"on": ([1.0, 2.0], [0.1, 3.0])}, title="s", bound_s=2.0)),
             "block_size_kv_waste.png": recorded(functools.partial(plot_metric_vs_block_size, ablation, "kv_waste")),
             "hit_rate.png": recorded(functools.partial(plot_hit_rate_vs_capacity, replay, note="n"))}
    fs = FlagSet()
    out = OutputFlags(fs, plot_dir="")
    fs.parse(["prog"])
    assert out.write({"x": 1}, plots=plots, echo=False) == [] and built == []  # no --plot_dir: nothing drawn
    fs.parse(["prog", f"--plot_dir={tmp_path}/plots"])
    written = out.write({"x": 1}, plots=plots, echo=False)
    assert written == [tmp_path / "plots" / name for name in plots] and len(built) == len(plots)
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(plots)
    sizes = {p.name: _png_size(p.read_bytes()) for p in written}
    # each at its figure's own size and dpi: 5 x 5 in and 7 x 4.5 in at 120 dpi, 6 x 4 in at matplotlib's 100
    assert sizes["validation.png"] == (600, 600) and sizes["sweep.png"] == (840, 540)
    assert sizes["block_size_kv_waste.png"] == (600, 400)
