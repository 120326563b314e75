"""`bench startup`'s tables: the ratio to the baseline's uncached start, token agreement, cache hits."""

from jaxpaged.bench.offline.startup import padding_table, startup_table


def _result():
    runs = {"generate/small/before/off": [{"tokens_digest": "a"}, {"tokens_digest": "a"}],
            "generate/small/after/warm": [{"tokens_digest": "b"}],
            "serve/small/after/cold": [{}]}
    median = {
        "generate/small/before/off": {"total_s": 10.0, "import_s": 1.0, "build_s": 2.0, "generate_s": 7.0,
                                      "compiles": 8, "cache_hits": 0, "cache_lookups": 8},
        "generate/small/after/warm": {"total_s": 4.0, "import_s": 1.0, "build_s": 1.0, "generate_s": 2.0,
                                      "compiles": 8, "cache_hits": 8, "cache_lookups": 8},
        "serve/small/after/cold": {"total_s": 12.0, "healthy_s": 5.0, "first_token_after_request_s": 3.0},
    }
    return {"runs": runs, "median": median}


def test_startup_table_rows_against_the_baseline():
    lines = startup_table(_result(), "before").splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    before, warm, serve = cells
    assert before[4:] == ["10.0", "3.0", "7.0", "8", "0 / 8", "yes", "1.00x"]  # up = import + build
    assert warm[4:] == ["4.0", "2.0", "2.0", "8", "8 / 8", "no", "0.40x"]  # other tokens than the baseline's
    assert serve[4:] == ["12.0", "5.0", "3.0", "", "", "", ""]  # no serve baseline: no ratio
    assert lines[1] == "|---|---|---|---|---:|---:|---:|---:|---:|---|---:|"


def test_startup_table_without_a_baseline_has_no_ratios_or_token_checks():
    cells = [line.strip("|").split("|") for line in startup_table(_result()).splitlines()[2:]]
    assert all(row[-1].strip() == "" and row[-2].strip() == "" for row in cells)


def test_padding_table_one_row_per_case():
    table = padding_table({"small": [{"case": "decode", "padding": "seqs = 64", "median_ms": 1.26}],
                           "llama-100m": [{"case": "mixed", "padding": "tokens = 512", "median_ms": 10.04}]})
    assert table.splitlines()[2:] == ["| small | decode | seqs = 64 | 1.3 |", "| llama-100m | mixed | tokens = 512 | 10.0 |"]


def test_startup_table_of_a_checkpoint_path_with_slashes():
    key = "generate//work/ckpt/smollm2-hf/vllm/cold"
    result = {"runs": {key: [{"tokens_digest": "a"}]},
              "median": {key: {"total_s": 9.0, "import_s": 1.0, "build_s": 3.0, "generate_s": 5.0}}}
    row = [c.strip() for c in startup_table(result).splitlines()[2].strip("|").split("|")]
    assert row[:4] == ["generate", "/work/ckpt/smollm2-hf", "vllm", "cold"]
