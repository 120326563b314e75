"""Request bodies of the OpenAI API as vLLM accepts them (pydantic), and their SamplingParams.

Integers and booleans are strict (`true` is not 1, `"5"` is not 5); floats accept
integers. Fields the engine does not implement are accepted and ignored, as
vLLM ignores them; the engine's own checks (ranges, finiteness, lengths) run
when the request is added and come back as 400s naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams

Number = Annotated[float, Field(strict=False)]
TokenIds = list[StrictInt]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[StrictInt] | None = None
    ignore_eos: StrictBool = False
    include_stop_str_in_output: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    cache_salt: StrictStr | None = None
    pin_ttl_s: Number | None = None  # pin the prompt's full blocks for this long (jaxpaged extension)

    def sampling_params(self, *, default_max_tokens: int, logprobs: int | None) -> SamplingParams:
        """The engine's SamplingParams (ValueError naming the field when a value is out of range)."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            max_tokens=default_max_tokens if self.max_tokens is None else self.max_tokens,
            stop=stop, stop_token_ids=list(self.stop_token_ids or []), ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output, logprobs=logprobs,
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`."""

    prompt: StrictStr | TokenIds | list[StrictStr] | list[TokenIds]
    logprobs: StrictInt | None = None
    echo: StrictBool = False

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise ValueError("prompt is empty: at least one token is needed")
        if isinstance(p[0], int):
            return [p]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: StrictStr
    content: StrictStr | list[dict] | None = None

    def text(self) -> str:
        """The message's text (the text parts of a list content)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("messages: only text content parts ({'type': 'text', 'text': ...}) are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_SamplingFields):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    add_generation_prompt: StrictBool = True

    def logprobs_k(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


class TokenizeRequest(BaseModel):
    """`POST /tokenize`: a prompt or chat messages."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True


class PinRequest(BaseModel):
    """`POST /v1/cache/pin`: keep a prefix's blocks for `ttl_s` seconds (0 unpins); a prompt or messages."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | TokenIds | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: StrictBool = True
    cache_salt: StrictStr | None = None
    ttl_s: Number


class DetokenizeRequest(BaseModel):
    """`POST /detokenize`."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    tokens: list[StrictInt]


ObjectName = Literal["text_completion", "chat.completion"]
