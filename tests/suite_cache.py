"""Where the test suite keeps its persistent XLA compilation cache.

One directory per user, shared by every clone and worktree of the project on
the machine (JAX keys each entry by the compiled program, the XLA flags and the
jax/jaxlib versions, so clones at different commits can share it safely), and
separate from the cache engines use by default, so tests never write the user's
own cache. A fresh clone on a machine that ran the suite before starts warm,
instead of recompiling every step shape (about a third of a cold run).
`$JAXPAGED_TEST_CACHE_DIR` picks another directory: an empty one gives a cold run.
"""

import os
from pathlib import Path


def suite_cache_dir() -> Path:
    """`$JAXPAGED_TEST_CACHE_DIR`, else `$XDG_CACHE_HOME/jaxpaged/test-xla`, else `~/.cache/jaxpaged/test-xla`."""
    if os.environ.get("JAXPAGED_TEST_CACHE_DIR"):
        return Path(os.environ["JAXPAGED_TEST_CACHE_DIR"]).expanduser().resolve()
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "jaxpaged" / "test-xla"


SUITE_CACHE = suite_cache_dir()
