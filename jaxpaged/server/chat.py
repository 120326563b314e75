"""Chat prompts: the checkpoint's chat template (jinja2), found where transformers finds it.

`ChatTemplate.for_model` looks, in order, at:
1. an explicit template file (`jaxpaged serve --chat_template=FILE`: jinja text, or a JSON with "chat_template");
2. a checkpoint directory's `chat_template.jinja` (transformers >= 4.47 saves it there and reads it first),
   then the `chat_template` field of its `tokenizer_config.json`, then a legacy `chat_template.json`
   (the processor file of multimodal checkpoints);
3. a GGUF file's `tokenizer.chat_template` metadata.

A checkpoint with a tokenizer of its own (a real model) but no template gets
none: a chat request is refused with a ValueError (HTTP 400) rather than
rendered by an invented format, as vLLM does. The shipped random-weight configs
(tiny, small, ...) and checkpoints saved from them (byte tokenizer, no
tokenizer files) use `DEFAULT_CHAT_TEMPLATE`, which writes each message as
`<|role|>\\ncontent\\n` and, with `add_generation_prompt`, ends with `<|assistant|>\\n`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import jinja2.sandbox

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
JINJA_FILE, TOKENIZER_CONFIG, LEGACY_JSON_FILE = "chat_template.jinja", "tokenizer_config.json", "chat_template.json"
OWN_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")  # a checkpoint with these is a real model


class ChatTemplate:
    """Renders a list of `{role, content}` messages into one prompt string (`source=None`: chat is refused)."""

    def __init__(self, source: str | None = DEFAULT_CHAT_TEMPLATE, *, bos_token: str = "", eos_token: str = "",
                 missing_reason: str = "this model has no chat template"):
        """`source` is the jinja text; None makes `render` raise ValueError with `missing_reason`."""
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(source) if source is not None else None
        self.source = source  # which tool-call format the model writes is read off it (server/tools.py)
        self.bos_token, self.eos_token = bos_token, eos_token
        self.missing_reason = missing_reason

    @classmethod
    def for_model(cls, model: str, override: str | None = None) -> "ChatTemplate":
        """The template for `model` (a checkpoint directory, a GGUF file or a shipped config name); `override`
        is a template file that wins over the checkpoint's own. ValueError if `override` cannot be read."""
        template = cls._own(model)
        if override:
            return cls(_read_template_file(Path(override)), bos_token=template.bos_token,
                       eos_token=template.eos_token)
        return template

    @classmethod
    def _own(cls, model: str) -> "ChatTemplate":
        """The template `model` ships (or the default, or none: see the module docstring)."""
        from jaxpaged.gguf_file import is_gguf_file

        path = Path(model)
        if is_gguf_file(path):
            from jaxpaged.gguf_tokenizer import gguf_chat_template
            source, bos, eos = gguf_chat_template(path)
            return cls(source, bos_token=bos, eos_token=eos, missing_reason=(
                f"{path.name} has no tokenizer.chat_template: pass the server a template with --chat_template=FILE"))
        if not path.is_dir():
            return cls()  # a shipped random-weight config
        source = _directory_template(path)
        if source is None and not any((path / name).is_file() for name in OWN_TOKENIZER_FILES):
            return cls()  # a random-weight checkpoint with the byte tokenizer
        config = _read_json(path / TOKENIZER_CONFIG)
        return cls(source, bos_token=_token_text(config.get("bos_token")),
                   eos_token=_token_text(config.get("eos_token")), missing_reason=(
            f"{path.name} has no chat template ({JINJA_FILE}, {TOKENIZER_CONFIG} or {LEGACY_JSON_FILE}): "
            "pass the server a template with --chat_template=FILE"))

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """The prompt text; ValueError when the model has no template or the template rejects the conversation.

        `tools` (OpenAI tool definitions) are passed to the template as `tools`, as Hugging Face does.
        """
        if self.template is None:
            raise ValueError(f"messages: {self.missing_reason}")
        extra = {} if tools is None else {"tools": tools}
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as err:
            raise ValueError(f"messages: the chat template failed: {err}") from None


def _directory_template(path: Path) -> str | None:
    """The template a checkpoint directory ships, in transformers' order of precedence (module docstring)."""
    if (path / JINJA_FILE).is_file():
        return (path / JINJA_FILE).read_text(encoding="utf-8")
    source = _pick_default(_read_json(path / TOKENIZER_CONFIG).get("chat_template"))
    if source is None and (path / LEGACY_JSON_FILE).is_file():
        source = _pick_default(_read_json(path / LEGACY_JSON_FILE).get("chat_template"))
    return source


def _read_template_file(path: Path) -> str:
    """A `--chat_template` file: jinja text, or JSON holding "chat_template"."""
    if not path.is_file():
        raise ValueError(f"chat template file {path} does not exist")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        source = _pick_default(json.loads(text).get("chat_template"))
        if source is None:
            raise ValueError(f"chat template file {path} has no \"chat_template\" string")
        return source
    return text


def _pick_default(source) -> str | None:
    """A template string, or from a list of named templates the one named "default"."""
    if isinstance(source, list):
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    return source if isinstance(source, str) else None


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _token_text(token) -> str:
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""
