"""The persistent XLA compilation cache: where it lives, and turning it on before the first compile.

Every engine start compiles its step shapes; with this cache a second start
on the same machine loads the executables from disk instead (vLLM keeps its
compiled graphs under `VLLM_CACHE_ROOT` the same way). JAX's cache is
process-wide, so `configure` sets it for the whole process: the last engine
created decides.

Where (`EngineConfig.compile_cache_dir`, `--compile_cache_dir`):

- `"auto"` (the default): what JAX is already configured with (a directory
  from `jax.config.update("jax_compilation_cache_dir", ...)` or
  `$JAX_COMPILATION_CACHE_DIR`; off when that directory is set but empty, as
  JAX itself reads it, after `jax_enable_compilation_cache=False` or after an
  earlier `configure(None)` / `configure("")`), else `$JAXPAGED_CACHE_DIR`
  (set but empty: off), else `$XDG_CACHE_HOME/jaxpaged/xla`, else
  `~/.cache/jaxpaged/xla`;
- a path: that directory;
- `""` or `None`: no persistent cache.

So a command with a cache flag of its own calls `configure(flag)` before it
builds an engine (whose `"auto"` then keeps that choice, off included), and
hands a server it starts `child_env(flag)`.

What makes it safe:

- JAX keys an entry by the SHA-256 of the canonicalised StableHLO module (shapes, dtypes, donation as input/output aliases, shardings, and
  any Pallas kernel, whose lowered body or serialised kernel is part of the
  module), the compile options and XLA flags, the device kind and count, and
  the jax/jaxlib versions. A different kernel, config, donation or
  `XLA_FLAGS` therefore gets a different entry (`tests/engine/test_compile_cache.py`).
- Entries are zlib-compressed, so a torn write fails to decompress; JAX then
  warns and compiles afresh. Setting a size limit (the default here,
  `DEFAULT_MAX_BYTES`) also makes JAX take a file lock around every read and
  write, so two processes sharing the directory never see each other's
  half-written entry, and it evicts least-recently-used entries past the limit.
- Small CPU compiles are cached too (JAX's default skips compiles under 1 s).

The cache is trusted code: do not point it at a directory others can write.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

AUTO = "auto"
ENV_DIR = "JAXPAGED_CACHE_DIR"
DEFAULT_MAX_BYTES = 8 << 30  # LRU-evicted past this (and file-locked: see the module docstring)

logger = logging.getLogger(__name__)

_LOOKUPS = "/jax/compilation_cache/compile_requests_use_cache"
_HITS = "/jax/compilation_cache/cache_hits"
_counts: collections.Counter = collections.Counter()
_listening = threading.Lock()
_listener_installed = False


def cache_counts() -> tuple[int, int]:
    """`(lookups, hits)` of the persistent cache in this process so far (misses compiled afresh)."""
    _install_listener()
    return _counts[_LOOKUPS], _counts[_HITS]


def _install_listener() -> None:
    global _listener_installed
    with _listening:
        if not _listener_installed:
            jax.monitoring.register_event_listener(_count_event)
            _listener_installed = True


def _count_event(event: str, **_) -> None:
    if event in (_LOOKUPS, _HITS):
        _counts[event] += 1


def user_cache_dir() -> str | None:
    """`$JAXPAGED_CACHE_DIR` (empty: None, off), else `$XDG_CACHE_HOME/jaxpaged/xla`, else `~/.cache/jaxpaged/xla`."""
    if ENV_DIR in os.environ:
        return os.environ[ENV_DIR] or None
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "jaxpaged", "xla")


def resolve_cache_dir(setting: str | os.PathLike | None) -> str | None:
    """The directory `setting` names (`"auto"`, a path, or `""`/None for off), as an absolute path or None."""
    if setting is None or setting == "":
        return None
    if setting == AUTO:
        jax_dir = jax.config.jax_compilation_cache_dir
        if not jax.config.jax_enable_compilation_cache or jax_dir == "":  # JAX's own "off": an empty directory
            return None
        setting = user_cache_dir() if jax_dir is None else jax_dir
        if setting is None:
            return None
    return str(Path(setting).expanduser().resolve())


def configure(setting: str | os.PathLike | None = AUTO) -> str | None:
    """Point this process's persistent XLA cache at `setting`'s directory (or turn it off); returns it.

    Call before the first compile that should be cached. Calling again with
    another directory (or off) switches the cache; the same one is a no-op.
    """
    _install_listener()
    path = resolve_cache_dir(setting)
    wanted = {"jax_enable_compilation_cache": path is not None}
    if path is not None:
        wanted |= {"jax_compilation_cache_dir": path,
                   "jax_persistent_cache_min_compile_time_secs": 0.0,
                   "jax_persistent_cache_min_entry_size_bytes": 0}
        if jax.config.jax_compilation_cache_max_size == -1:  # unlimited is JAX's default; keep a user's own limit
            wanted["jax_compilation_cache_max_size"] = DEFAULT_MAX_BYTES
    changed = {name: value for name, value in wanted.items() if getattr(jax.config, name) != value}
    if not changed:
        return path
    for name, value in changed.items():
        jax.config.update(name, value)
    compilation_cache.reset_cache()  # JAX opens its cache once; make it reopen with the new settings
    logger.info("persistent XLA compilation cache: %s", path or "off")
    return path


def child_env(setting: str | os.PathLike | None) -> dict[str, str]:
    """Environment variables that give a child process (a `jaxpaged serve` a benchmark starts) `setting`'s cache.

    `setting` is resolved here, in the parent, so the child's engines, built
    with `"auto"`, find JAX configured with that same directory, or with the
    cache off; JAX reads both variables at import.
    """
    path = resolve_cache_dir(setting)
    return {"JAX_ENABLE_COMPILATION_CACHE": "true" if path else "false", "JAX_COMPILATION_CACHE_DIR": path or ""}


def validate_setting(name: str, setting) -> None:
    """ValueError unless `setting` is None, a string or a path (`"auto"`, `""` or a directory)."""
    if setting is not None and not isinstance(setting, (str, os.PathLike)):
        raise ValueError(f"{name} must be a directory, 'auto' or '' (off), got {setting!r}")
    if setting and setting != AUTO and Path(setting).expanduser().exists() and not Path(setting).expanduser().is_dir():
        raise ValueError(f"{name} must be a directory, got the file {str(setting)!r}")
