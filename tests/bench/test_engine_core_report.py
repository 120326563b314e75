"""`bench engine-core`'s pure parts: process roles from the launcher's log, /proc CPU times, per-step means, table."""

import os

import pytest

from jaxpaged.bench.online.engine_core import core_step_ms, cpu_seconds, engine_core_table, process_roles


def test_roles_come_from_the_launchers_log_line_or_one_process_does_all():
    log = "INFO starting\nINFO engine core pid 41; API servers [42, 43]\nINFO ready"
    assert process_roles(log, 40) == {41: "engine core", 42: "API server 0", 43: "API server 1", 40: "launcher"}
    assert process_roles("INFO ready", 40) == {40: "server (engine + API)"}


def test_cpu_seconds_read_utime_and_stime_past_a_command_name_with_spaces():
    tick = os.sysconf("SC_CLK_TCK")
    fields = ["S"] + ["0"] * 10 + [str(3 * tick), str(tick)] + ["0"] * 30  # fields 14 and 15 of the stat line
    assert cpu_seconds(f"123 (a (b) c) {' '.join(fields)}") == 4.0


def test_core_step_ms_is_the_mean_over_the_decode_steps_between_two_reads():
    assert core_step_ms([1.0, 10, 2.0], [1.5, 20, 2.2]) == pytest.approx((50.0, 20.0))
    assert core_step_ms([1.0, 10, 2.0], [1.5, 10, 2.2]) == (None, None)  # no decode step
    assert core_step_ms([None] * 3, [None] * 3) == (None, None)  # no core process


ROW = {"config": "process", "concurrency": 64, "output_tok_s": 1234.4, "device_busy": 0.5, "never_idle_tok_s": 2468.8,
       "tpot_p50_ms": 10.04, "tpot_p99_ms": 20.0, "itl_p50_ms": 9.95, "itl_p99_ms": 30.0,
       "cpu_us_per_token": {"engine core": 12.34, "API server 0": 5.0}, "load_generator_us_per_token": 7.0,
       "core_host_ms_per_step": 1.234, "core_loop_cpu_ms_per_step": 0.5}


def test_the_table_holds_every_run_and_the_host_rows_when_measured():
    thread = ROW | {"config": "thread", "core_host_ms_per_step": None, "core_loop_cpu_ms_per_step": None}
    lines = engine_core_table([ROW, thread]).splitlines()
    assert len(lines) == 4 and lines[1] == "|" + "---|" * 10
    assert lines[2] == ("| process | 64 | 1234 | 0.50 | 2469 | 10.0 / 20.0 | 9.9 / 30.0 "
                        "| engine core: 12.3, API server 0: 5.0 | 7.0 | 1.23 / 0.50 |")
    assert lines[3].endswith("| 7.0 | - |")
    host = {"num_seqs": 64, "device": "h200-141gb", "host_ms": 1.5, "wire_ms": 0.25, "us_per_seq": 23.4375,
            "cpu_ms": 1.4, "device_busy": 0.95}
    lines = engine_core_table([ROW], [host]).splitlines()
    assert lines[3] == "" and lines[5] == "|---:|---|---:|---:|---:|---:|---:|"
    assert lines[6] == "| 64 | h200-141gb | 1.500 | 0.250 | 23.44 | 1.400 | 95.0% |"
