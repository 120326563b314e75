"""Benchmark results on disk: JSON with the memory environment it was measured in, and the Markdown table."""

import json

from jaxpaged.bench.output import memory_environment, write_outputs


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
