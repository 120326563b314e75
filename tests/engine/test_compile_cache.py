"""The persistent XLA compile cache: where it lives, that its keys tell programs apart, and that processes share it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from jaxpaged import compile_cache
from jaxpaged.engine import Engine, EngineConfig
from jaxpaged.runner import cpu_step
from jaxpaged.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [5, 17, 42, 99, 3, 250, 7, 8, 9, 10, 11]
ENGINE = dict(model="tiny", num_blocks=32, block_size=4, max_num_seqs=2)
PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture
def own_cache(tmp_path):
    """Point the process's cache at a fresh directory for one test, then back at the suite's."""
    yield tmp_path / "xla"
    compile_cache.configure(os.environ[compile_cache.ENV_DIR])


def _entries(path: Path) -> set[str]:
    return {p.name for p in path.glob("*-cache")} if path.exists() else set()


def test_cache_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv(compile_cache.ENV_DIR, str(tmp_path / "mine"))
    assert compile_cache.user_cache_dir() == str(tmp_path / "mine")
    monkeypatch.setenv(compile_cache.ENV_DIR, "")
    assert compile_cache.user_cache_dir() is None  # set but empty: off
    monkeypatch.delenv(compile_cache.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert compile_cache.user_cache_dir() == str(tmp_path / "xdg" / "jaxpaged" / "xla")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert compile_cache.user_cache_dir() == str(tmp_path / "home" / ".cache" / "jaxpaged" / "xla")
    assert compile_cache.resolve_cache_dir("") is None and compile_cache.resolve_cache_dir(None) is None
    assert compile_cache.resolve_cache_dir("~/c") == str(tmp_path / "home" / "c")
    # "auto" keeps what JAX is already configured with (here: the suite's own cache, never the user's)
    assert compile_cache.resolve_cache_dir("auto") == jax.config.jax_compilation_cache_dir
    assert EngineConfig().compile_cache_dir == "auto"


def test_engine_config_rejects_a_bad_compile_cache_dir(tmp_path):
    with pytest.raises(ValueError, match="compile_cache_dir"):
        EngineConfig(compile_cache_dir=5)
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="compile_cache_dir.*file"):
        EngineConfig(compile_cache_dir=str(tmp_path / "f"))


def _add_kernel(amount: float):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...] + amount
    return lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype), interpret=True)(x)


def _programs():
    """Same shapes, different programs: a donated and a plain copy of one function, the plain one compiled
    with a step's XLA:CPU options (`cpu_compiler_options`), two Pallas kernels."""
    return {"plain": jax.jit(lambda x: x * 3.0), "donated": jax.jit(lambda x: x * 3.0, donate_argnums=0),
            "options": jax.jit(lambda x: x * 3.0, compiler_options=cpu_step.PRESETS["eigen"]),
            "kernel+1": jax.jit(_add_kernel(1.0)), "kernel+2": jax.jit(_add_kernel(2.0))}


def test_keys_tell_donation_compile_options_and_pallas_kernels_apart(own_cache):
    compile_cache.configure(str(own_cache))
    want = {"plain": 3.0, "donated": 3.0, "options": 3.0, "kernel+1": 2.0, "kernel+2": 3.0}
    first = {name: float(f(jnp.ones(8))[0]) for name, f in _programs().items()}
    written = _entries(own_cache)
    assert first == want
    assert len([e for e in written if e.startswith("jit__lambda")]) == 5  # one entry per program

    lookups, hits = compile_cache.cache_counts()
    again = {name: float(f(jnp.ones(8))[0]) for name, f in _programs().items()}  # new jits: from disk
    assert again == want  # a stale entry would have served the other kernel's or copy's executable
    assert compile_cache.cache_counts() == (lookups + 5, hits + 5)
    assert _entries(own_cache) == written

    compile_cache.configure("")  # off: nothing looked up, nothing written
    assert float(jax.jit(lambda x: x * 5.0)(jnp.ones(8))[0]) == 5.0
    assert compile_cache.cache_counts() == (lookups + 5, hits + 5) and _entries(own_cache) == written


_WORKER = """
import json, sys, warnings
from jaxpaged import LLM, compile_cache
from jaxpaged.sampling_params import SamplingParams
warnings.simplefilter("error")  # a torn or unreadable entry makes JAX warn: fail instead
llm = LLM(compile_cache_dir=sys.argv[1], **json.loads(sys.argv[2]))
out = llm.generate([json.loads(sys.argv[3])], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                   use_tqdm=False)
print(json.dumps({"tokens": out[0].outputs[0].token_ids, "counts": compile_cache.cache_counts()}))
"""


def test_two_processes_fill_one_cache_and_a_third_start_only_loads(own_cache):
    """Two cold starts race on one directory (both correct, no unreadable entry); a later start compiles nothing."""
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(own_cache), json.dumps(ENGINE),
                               json.dumps(PROMPT)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    assert results[0]["tokens"] == results[1]["tokens"]
    assert all(r["counts"][0] > 0 for r in results)

    lookups, hits = compile_cache.cache_counts()
    engine = Engine(EngineConfig(compile_cache_dir=str(own_cache), **ENGINE))  # sets the cache, then builds
    engine.add_request("0", PROMPT, PARAMS)
    tokens = []
    while engine.has_unfinished_requests():
        tokens += [o.outputs[0].token_ids for o in engine.step() if o.finished]
    new_lookups, new_hits = compile_cache.cache_counts()
    assert engine.runner.num_compiles > 0 and new_lookups - lookups >= engine.runner.num_compiles
    assert new_hits - hits == new_lookups - lookups  # every program came from the disk
    assert tokens == [results[0]["tokens"]]
