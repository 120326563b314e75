"""Benchmark results on disk: JSON with the memory environment it was measured in, and the Markdown table."""

import json

import pytest

from jaxpaged.report import memory_environment, write_outputs


def test_memory_environment_reads_the_bracketed_thp_mode(tmp_path, monkeypatch):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    assert memory_environment(setting) == {"transparent_hugepage": "madvise",
                                           "GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert memory_environment(tmp_path / "absent") == {"transparent_hugepage": None, "GLIBC_TUNABLES": None}


def test_outputs_carry_the_environment_and_only_go_where_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1")
    write_outputs({"x": 1}, "| a |", str(tmp_path / "deep" / "r.json"), None)
    written = json.loads((tmp_path / "deep" / "r.json").read_text())
    assert written["x"] == 1 and written["memory_environment"]["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1"
    assert list(tmp_path.rglob("*.md")) == []
    write_outputs({"x": 1}, "| a |", None, str(tmp_path / "t.md"))
    assert (tmp_path / "t.md").read_text() == "| a |\n"


def test_markdown_table_aligns_and_refuses_ragged_rows():
    from jaxpaged.report import markdown_table
    assert markdown_table(["metric", "a", "b"], [["x", 1, "2.0"]]) == "| metric | a | b |\n|---|---:|---:|\n| x | 1 | 2.0 |"
    assert markdown_table(["p", "q"], [], align="rl").splitlines()[1] == "|---:|---|"
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["p", "q"], [["only one"]])


def test_output_flags_write_each_output_only_where_its_flag_points(tmp_path, capsys):
    from jaxpaged.cli.flagset import FlagSet
    from jaxpaged.cli.output_flags import OutputFlags
    fs = FlagSet()
    out = OutputFlags(fs, json_out=str(tmp_path / "default.json"), plot_dir="")
    from matplotlib.figure import Figure
    drawn = []
    plots = {"p.png": lambda: drawn.append("p.png") or Figure(figsize=(1, 1))}
    fs.parse(["prog", f"--md_out={tmp_path}/t.md"])
    assert out.write({"x": 1}, "| t |", plots=plots) == [] and drawn == []  # --plot_dir='' draws nothing
    written = json.loads((tmp_path / "default.json").read_text())
    assert written["x"] == 1 and written["flags"]["md_out"] == f"{tmp_path}/t.md"  # the flags it ran with
    assert (tmp_path / "t.md").read_text() == "| t |\n" and capsys.readouterr().out.startswith("| t |")
    fs.parse(["prog", "--json_out=", f"--plot_dir={tmp_path}/plots"])
    (tmp_path / "default.json").unlink()
    assert out.write({"x": 2}, plots=plots) == [tmp_path / "plots" / "p.png"] and drawn == ["p.png"]
    assert not (tmp_path / "default.json").exists()
    assert (tmp_path / "plots" / "p.png").read_bytes().startswith(b"\x89PNG")
