"""Save and restore model weights with Orbax, the config stored beside them as JSON.

Layout of a saved directory:
    jaxpaged_config.json   the `ModelConfig` (its presence marks the directory as ours)
    params/                Orbax `StandardCheckpointer` output for the `nnx.Param` state
Derived variables (the RoPE table) are not stored: they are rebuilt from the config.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from flax import nnx

from jaxpaged.checkpoint.skeleton import ShardingOf, abstract_param_state, assemble_model
from jaxpaged.config import ModelConfig
from jaxpaged.model.decoder import DecoderModel

CONFIG_FILE = "jaxpaged_config.json"
PARAMS_DIR = "params"


def is_orbax_checkpoint_dir(path: str | Path) -> bool:
    """True when `path` was written by `save_params`."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / PARAMS_DIR).is_dir()


def save_params(model: DecoderModel, path: str | Path, *, overwrite: bool = False) -> None:
    """Write `model`'s weights and config under directory `path` (created if needed).

    An existing checkpoint there is an error unless `overwrite`.
    """
    path = Path(path).absolute()  # Orbax requires absolute paths
    path.mkdir(parents=True, exist_ok=True)
    params = nnx.state(model, nnx.Param)
    dtype = jax.tree.leaves(params)[0].dtype
    config = model.config.replace(dtype=dtype.name)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(path / PARAMS_DIR, params, force=overwrite)
        checkpointer.wait_until_finished()
    (path / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=2))


def read_saved_config(path: str | Path) -> ModelConfig:
    """The `ModelConfig` stored by `save_params` under `path`."""
    return ModelConfig.from_dict(json.loads((Path(path) / CONFIG_FILE).read_text()))


def load_params(path: str | Path, dtype=None, sharding_of: ShardingOf | None = None) -> DecoderModel:
    """Rebuild the model saved under `path`; `dtype` casts the weights (default: as saved).

    With `sharding_of` (tensor parallelism) Orbax restores each weight straight
    into its per-device shards.
    """
    path = Path(path).absolute()
    if not is_orbax_checkpoint_dir(path):
        raise ValueError(f"{path} is not a jaxpaged Orbax checkpoint (no {CONFIG_FILE} + {PARAMS_DIR}/)")
    config = read_saved_config(path)
    with ocp.StandardCheckpointer() as checkpointer:
        restored = checkpointer.restore(path / PARAMS_DIR, _with_shardings(abstract_param_state(config),
                                                                           sharding_of))
    flat = {p: v.get_value() for p, v in nnx.to_flat_state(restored)}
    return assemble_model(config, flat, dtype, sharding_of)


def _with_shardings(state: nnx.State, sharding_of: ShardingOf | None) -> nnx.State:
    if sharding_of is None:
        return state
    for path, var in nnx.to_flat_state(state):
        shape = var.get_value()
        var.set_value(jax.ShapeDtypeStruct(shape.shape, shape.dtype,
                                           sharding=sharding_of(path, tuple(shape.shape))))
    return state
