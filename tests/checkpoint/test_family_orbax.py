"""A family config (Gemma 3: q/k norms, sandwich norms, local RoPE, linear scaling) through Orbax and back."""

import numpy as np

from jaxpaged.checkpoint import load_model, save_params
from jaxpaged.config import load_config
from jaxpaged.model import init_model
from tests.paged_driver import dense_logits


def test_gemma3_orbax_round_trip_keeps_config_and_logits(tmp_path):
    model = init_model(load_config("tiny-gemma3"), seed=1)
    save_params(model, tmp_path / "orbax")
    restored = load_model(tmp_path / "orbax")
    assert restored.config == model.config and restored.config.rope_scaling.rope_type == "linear"
    tokens = [(7 * i) % 250 for i in range(48)]
    np.testing.assert_array_equal(dense_logits(restored, tokens), dense_logits(model, tokens))
