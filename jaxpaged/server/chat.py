"""Chat prompts: the checkpoint's chat template (tokenizer_config.json, jinja2), or a plain default.

The shipped configs (tiny, small, ...) have no template; they use
`DEFAULT_CHAT_TEMPLATE`, which writes each message as `<|role|>\\ncontent\\n`
and, with `add_generation_prompt`, ends with `<|assistant|>\\n`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import jinja2.sandbox

DEFAULT_CHAT_TEMPLATE = (
    "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


class ChatTemplate:
    """Renders a list of `{role, content}` messages into one prompt string."""

    def __init__(self, source: str = DEFAULT_CHAT_TEMPLATE, *, bos_token: str = "", eos_token: str = ""):
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.template = env.from_string(source)
        self.source = source  # which tool-call format the model writes is read off it (server/tools.py)
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def for_model(cls, model: str) -> "ChatTemplate":
        """The template in `model/tokenizer_config.json` when `model` is a directory that has one."""
        path = Path(model) / "tokenizer_config.json"
        if path.is_file():
            config = json.loads(path.read_text())
            source = config.get("chat_template")
            if isinstance(source, list):  # named templates: take the default one
                source = next((t["template"] for t in source if t.get("name") == "default"), None)
            if isinstance(source, str):
                return cls(source, bos_token=_token_text(config.get("bos_token")),
                           eos_token=_token_text(config.get("eos_token")))
        return cls()

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               tools: list[dict] | None = None) -> str:
        """The prompt text; ValueError when the template rejects the conversation.

        `tools` (OpenAI tool definitions) are passed to the template as `tools`, as Hugging Face does.
        """
        extra = {} if tools is None else {"tools": tools}
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token, **extra)
        except jinja2.TemplateError as err:
            raise ValueError(f"messages: the chat template failed: {err}") from None


def _raise(message: str):
    raise jinja2.TemplateError(message)


def _token_text(token) -> str:
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""
