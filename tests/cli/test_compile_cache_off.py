"""`--compile_cache_dir=''` turns the persistent compile cache off for every engine a command builds.

The bug: a command with a cache flag of its own (`bench throughput`, `bench replicas`) skipped an empty
value, and the engines it built (`EngineConfig.compile_cache_dir="auto"`, in-process or in a server it
starts) fell back to the per-user directory. Here the suite's own cache directory
(`$JAXPAGED_CACHE_DIR`) plays the per-user one: "off" must not land there. Every command's flag is now
EngineFlags' one `compile_cache_dir` (tests/cli/test_engine_knob_flags.py keeps it so); each test here
stops the command right after its cache choice, before any engine is built.
"""

import os
import subprocess
import sys

import jax
import pytest
from absl import flags

from jaxpaged import compile_cache
from jaxpaged.cli.commands import COMMANDS
from jaxpaged.cli.engine_flags import EngineFlags
from jaxpaged.cli.flagset import FlagSet

RESOLVE_AUTO = "from jaxpaged import compile_cache; print(compile_cache.configure('auto'))"


class _Stop(Exception):
    """Raised by a stand-in once the command has made its cache choice."""


@pytest.fixture(autouse=True)
def suite_cache():
    """Each test starts and ends on the suite's own cache directory."""
    compile_cache.configure(os.environ[compile_cache.ENV_DIR])
    assert compile_cache.resolve_cache_dir("auto") is not None
    yield
    compile_cache.configure(os.environ[compile_cache.ENV_DIR])


def _command(name: str):
    return next(c for c in COMMANDS if c.name == name).load()


def test_an_empty_engine_flag_is_off():
    fs = FlagSet()
    engine = EngineFlags(fs, ["compile_cache_dir"])
    fs.parse(["prog", "--compile_cache_dir="])
    config = engine.config()
    assert config.compile_cache_dir == "" and compile_cache.configure(config.compile_cache_dir) is None
    assert compile_cache.resolve_cache_dir(compile_cache.AUTO) is None  # an engine built next keeps it off


def test_jaxs_own_empty_directory_is_off_for_auto():
    jax.config.update("jax_compilation_cache_dir", "")  # $JAX_COMPILATION_CACHE_DIR='' reads the same
    assert compile_cache.resolve_cache_dir(compile_cache.AUTO) is None


def test_bench_throughput_turns_the_cache_off_before_building_its_engine(monkeypatch):
    module = _command("bench throughput")

    def stop(*_, **__):
        raise _Stop

    from jaxpaged.bench.offline import throughput
    monkeypatch.setattr(throughput, "hf_checkpoint", stop)  # the first step after the cache choice
    module.FLAGS.parse(["prog", "--compile_cache_dir=", "--backend=jaxpaged"])
    with pytest.raises(_Stop):
        module.main([])
    assert not jax.config.jax_enable_compilation_cache
    assert compile_cache.resolve_cache_dir(compile_cache.AUTO) is None  # what its engine's "auto" resolves to


def test_bench_replicas_hands_its_servers_the_cache_off(monkeypatch, tmp_path):
    module = _command("bench replicas")
    handed = []

    def capture(*_, env, **__):
        handed.append(env)
        raise _Stop

    from jaxpaged.bench.online import replicas
    monkeypatch.setattr(replicas, "run_policies", capture)
    for value in ("", str(tmp_path / "shared")):
        module.FLAGS.parse(["prog", f"--compile_cache_dir={value}", "--num_requests=2"])
        with pytest.raises(_Stop):
            module.main([])
    off, shared = handed
    assert shared["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "shared")
    # a server started with that environment: its engines' "auto" is off, not $JAXPAGED_CACHE_DIR
    child = subprocess.run([sys.executable, "-c", RESOLVE_AUTO], env=os.environ | off, capture_output=True,
                           text=True, timeout=120, check=True)
    assert child.stdout.strip().splitlines()[-1] == "None"


def test_the_serving_benchmarks_turn_the_cache_off_and_have_no_second_switch(monkeypatch):
    module = _command("bench serving")

    def stop(*_, **__):
        raise _Stop

    monkeypatch.setattr(module, "load_model", stop)  # the first step after the cache choice
    module.FLAGS.parse(["prog", "--compile_cache_dir=", "--num_requests=2"])
    with pytest.raises(_Stop):
        module.main(["prog"])
    assert compile_cache.resolve_cache_dir(compile_cache.AUTO) is None
    with pytest.raises(flags.UnrecognizedFlagError):  # '' is the one off switch
        module.FLAGS.parse(["prog", "--nocompile_cache"])


def test_bench_prompt_stall_hands_its_engine_the_flag(monkeypatch, tmp_path):
    module = _command("bench prompt-stall")
    configs = []

    def capture(engine_config, **_):
        configs.append(engine_config)
        raise _Stop

    monkeypatch.setattr(module, "measure_prompt_stall", capture)
    for argv in (["--compile_cache_dir="], [f"--compile_cache_dir={tmp_path}"], []):
        module.FLAGS.parse(["prog", *argv])
        with pytest.raises(_Stop):
            module.main([])
    # the engine configures the process's cache from its config first (EngineBuilder), so '' is off there
    assert [c.compile_cache_dir for c in configs] == ["", str(tmp_path), compile_cache.AUTO]


@pytest.mark.parametrize("name, first_step, argv", [
    ("bench offload", "capacity_table", ["--parts=capacity"]),
    ("bench hybrid-kv", "compare_layouts", []),
])
def test_a_bench_turns_the_cache_off_before_building_its_engines(monkeypatch, tmp_path, name, first_step, argv):
    module = _command(name)

    def stop(*_, **__):
        raise _Stop

    monkeypatch.setattr(module, first_step, stop)  # the first step after the cache choice
    module.FLAGS.parse(["prog", f"--compile_cache_dir={tmp_path}", *argv])
    with pytest.raises(_Stop):
        module.main([])
    assert jax.config.jax_compilation_cache_dir == str(tmp_path.resolve())
    module.FLAGS.parse(["prog", "--compile_cache_dir=", *argv])
    with pytest.raises(_Stop):
        module.main([])
    assert not jax.config.jax_enable_compilation_cache
    assert compile_cache.resolve_cache_dir(compile_cache.AUTO) is None  # what its engines' "auto" resolves to


def test_check_dashboard_hands_its_server_the_flag(monkeypatch):
    module = _command("check-dashboard")
    started = []

    class Capture:
        def __init__(self, args, *_, **__):
            started.append(args)
            raise _Stop

    from jaxpaged.bench.online import dashboard_check
    monkeypatch.setattr(dashboard_check, "ServerProcess", Capture)
    monkeypatch.setattr(module.shutil, "which", lambda _: "/bin/prometheus")  # no Prometheus needed to stop here
    for value in ("", "/some/dir"):
        module.FLAGS.parse(["prog", f"--compile_cache_dir={value}"])
        with pytest.raises(_Stop):
            module.main([])
    assert [[a for a in args if a.startswith("--compile_cache_dir")] for args in started] == [
        ["--compile_cache_dir="], ["--compile_cache_dir=/some/dir"]]
