"""Where the chat template comes from (transformers' order, a GGUF's metadata, --chat_template), and a real
checkpoint without one refused for chat with a 400 instead of an invented format."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from jaxpaged.server.chat import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from tests.checkpoint.gguf_files import write_gguf
from tests.checkpoint.test_checkpoint_hf import BASE_HF_CONFIG, random_hf_weights

MESSAGES = [{"role": "user", "content": "hi"}]
JINJA = "{% for m in messages %}J:{{ m['content'] }}{% endfor %}"
CONFIG_FIELD = "{% for m in messages %}C:{{ m['content'] }}{% endfor %}"
LEGACY = "{% for m in messages %}L:{{ m['content'] }}{% endfor %}"


def _checkpoint(path, *, jinja=None, config_field=None, legacy=None, tokenizer=True):
    path.mkdir()
    if tokenizer:
        (path / "tokenizer.json").write_text("{}")  # only its presence matters here
    if jinja is not None:
        (path / "chat_template.jinja").write_text(jinja)
    if config_field is not None:
        (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": config_field, "eos_token": "</s>"}))
    if legacy is not None:
        (path / "chat_template.json").write_text(json.dumps({"chat_template": legacy}))
    return str(path)


def test_transformers_precedence_jinja_then_tokenizer_config_then_legacy_json(tmp_path):
    every = _checkpoint(tmp_path / "every", jinja=JINJA, config_field=CONFIG_FIELD, legacy=LEGACY)
    assert ChatTemplate.for_model(every).render(MESSAGES) == "J:hi"
    two = _checkpoint(tmp_path / "two", config_field=CONFIG_FIELD, legacy=LEGACY)
    assert ChatTemplate.for_model(two).render(MESSAGES) == "C:hi"
    assert ChatTemplate.for_model(two).eos_token == "</s>"
    legacy = _checkpoint(tmp_path / "legacy", legacy=LEGACY)
    assert ChatTemplate.for_model(legacy).render(MESSAGES) == "L:hi"


def test_named_templates_use_the_default_one(tmp_path):
    path = _checkpoint(tmp_path / "named", config_field=[{"name": "tool_use", "template": "T"},
                                                          {"name": "default", "template": CONFIG_FIELD}])
    assert ChatTemplate.for_model(path).render(MESSAGES) == "C:hi"


def test_override_file_wins_jinja_or_json(tmp_path):
    path = _checkpoint(tmp_path / "ckpt", jinja=JINJA)
    jinja = tmp_path / "mine.jinja"
    jinja.write_text("{% for m in messages %}O:{{ m['content'] }}{% endfor %}")
    as_json = tmp_path / "mine.json"
    as_json.write_text(json.dumps({"chat_template": "{% for m in messages %}X:{{ m['content'] }}{% endfor %}"}))
    assert ChatTemplate.for_model(path, str(jinja)).render(MESSAGES) == "O:hi"
    assert ChatTemplate.for_model(path, str(as_json)).render(MESSAGES) == "X:hi"
    with pytest.raises(ValueError, match="does not exist"):
        ChatTemplate.for_model(path, str(tmp_path / "absent.jinja"))


def test_real_checkpoint_without_template_is_refused_and_random_ones_keep_the_default(tmp_path):
    real = _checkpoint(tmp_path / "real")
    with pytest.raises(ValueError, match="has no chat template .*--chat_template"):
        ChatTemplate.for_model(real).render(MESSAGES)
    byte_tokenizer = _checkpoint(tmp_path / "random", tokenizer=False)
    assert ChatTemplate.for_model(byte_tokenizer).source == DEFAULT_CHAT_TEMPLATE
    assert ChatTemplate.for_model("tiny").source == DEFAULT_CHAT_TEMPLATE


def test_gguf_template_from_metadata_and_refusal_without_one(tmp_path):
    weights = random_hf_weights(BASE_HF_CONFIG, seed=0)
    template = "{{ bos_token }}{% for m in messages %}G:{{ m['content'] }}{{ eos_token }}{% endfor %}"
    with_template = write_gguf(tmp_path / "chat.gguf", BASE_HF_CONFIG, weights, chat_template=template)
    assert ChatTemplate.for_model(str(with_template)).render(MESSAGES) == "<|im_start|>G:hi<|im_end|>"
    without = write_gguf(tmp_path / "plain.gguf", BASE_HF_CONFIG, weights)
    with pytest.raises(ValueError, match="plain.gguf has no tokenizer.chat_template"):
        ChatTemplate.for_model(str(without)).render(MESSAGES)


def test_chat_without_a_template_is_a_400_and_completions_still_work(tiny_model):
    from jaxpaged.engine import Engine, EngineConfig
    from jaxpaged.server.api import build_app
    from jaxpaged.server.async_engine import AsyncEngine

    engine = Engine(EngineConfig(model="tiny", num_blocks=32, max_model_len=256), model=tiny_model)
    no_template = ChatTemplate(None, missing_reason="tiny has no chat template: pass --chat_template=FILE")
    with TestClient(build_app(AsyncEngine(engine), served_model_name="tiny", chat_template=no_template)) as client:
        response = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "max_tokens": 2})
        assert response.status_code == 400
        error = response.json()["error"]
        assert "no chat template" in error["message"] and error["type"] == "BadRequestError"
        tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
        with_tools = client.post("/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES,
                                                               "tools": [tool], "max_tokens": 2})
        assert with_tools.status_code == 400 and "no chat template" in with_tools.json()["error"]["message"]
        ok = client.post("/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 2})
        assert ok.status_code == 200
    assert engine.kv.stats.usage == 0
