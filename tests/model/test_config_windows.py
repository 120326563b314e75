"""Sliding-window fields of ModelConfig: per-layer windows, KV cache groups, validation."""

from __future__ import annotations

import json

import pytest

from jaxpaged.config import ModelConfig, load_config


def tiny(**changes) -> ModelConfig:
    return load_config("tiny").replace(**changes)


def test_llama_has_one_full_group():
    cfg = tiny()
    assert cfg.layer_windows == (None,) * cfg.num_layers
    assert cfg.attention_windows == (None,)


def test_sliding_window_without_layer_types_slides_every_layer():
    cfg = tiny(sliding_window=32)
    assert cfg.layer_windows == (32,) * cfg.num_layers
    assert cfg.attention_windows == (32,)


def test_interleaved_layer_types_give_two_groups_full_first():
    cfg = tiny(num_layers=3, sliding_window=32,
               layer_types=("sliding_attention", "full_attention", "sliding_attention"))
    assert cfg.layer_windows == (32, None, 32)
    assert cfg.attention_windows == (None, 32)


def test_layer_types_round_trip_through_json():
    cfg = tiny(num_layers=2, sliding_window=16, layer_types=("sliding_attention", "full_attention"))
    again = ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg


@pytest.mark.parametrize("changes, field", [
    (dict(sliding_window=0), "sliding_window"),
    (dict(num_layers=2, layer_types=("full_attention",)), "layer_types"),
    (dict(num_layers=1, sliding_window=8, layer_types=("chunked_attention",)), "chunked_attention"),
    (dict(num_layers=1, layer_types=("sliding_attention",)), "sliding_window"),
])
def test_bad_window_fields_are_value_errors_naming_them(changes, field):
    with pytest.raises(ValueError, match=field):
        tiny(**changes)
