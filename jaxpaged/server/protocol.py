"""Request bodies of the OpenAI API as vLLM accepts them (pydantic), and their SamplingParams.

Integers and booleans are strict (`true` is not 1, `"5"` is not 5); floats accept
integers. Fields the engine does not implement are accepted and ignored, as
vLLM ignores them (`user`, `suffix`, `best_of` equal to `n`, ...), except those
whose silent absence would change the tokens a client gets: `best_of > n` is
refused with a 400 naming the field. Structured output (`response_format`,
`guided_*`, `structured_outputs`; `jaxpaged.server.structured_fields`),
`allowed_token_ids` and `min_p` are served. The engine's own checks (ranges,
finiteness, lengths, whether a constraint compiles) run when the request is
added and come back as 400s naming the field.

Every list stops at its first bad item (`fail_fast`): validating a body costs
one error, not one per item (a list of 11M wrong items took 12 GB of errors).
The request's size limits (limits.py) are checked after this, before anything
is built for it.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from jaxpaged.outputs import RequestOutputKind
from jaxpaged.sampling_params import SamplingParams
from jaxpaged.server.structured_fields import structured_outputs_of

Number = Annotated[float, Field(strict=False)]
TokenIds = Annotated[list[StrictInt], Field(fail_fast=True)]
Strings = Annotated[list[StrictStr], Field(fail_fast=True)]


class StreamOptions(BaseModel):
    include_usage: StrictBool = False


class KVTransferParams(BaseModel):
    """vLLM's ``kv_transfer_params``, as far as jaxpaged uses it: the prefill engine's KV endpoint."""

    model_config = ConfigDict(extra="ignore")

    remote_address: StrictStr | None = None


class _SamplingFields(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    temperature: Number = 1.0
    top_p: Number = 1.0
    top_k: StrictInt = -1
    n: StrictInt = 1
    seed: StrictInt | None = None
    stop: StrictStr | Strings | None = None
    stop_token_ids: TokenIds | None = None
    ignore_eos: StrictBool = False
    include_stop_str_in_output: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    cache_salt: StrictStr | None = None
    priority: StrictInt = 0  # lower runs first under --scheduling_policy=priority (vLLM's extension)
    presence_penalty: Number = 0.0
    frequency_penalty: Number = 0.0
    repetition_penalty: Number = 1.0
    logit_bias: dict[StrictStr, object] | None = None  # values checked by SamplingParams, after its size
    min_tokens: StrictInt = 0
    prompt_logprobs: StrictInt | None = None  # vLLM's extension
    bad_words: Strings | None = None
    allowed_token_ids: TokenIds | None = None
    min_p: Number = 0.0
    # structured output (jaxpaged.server.structured_fields): at most one of these
    guided_json: object = None
    guided_regex: StrictStr | None = None
    guided_choice: Strings | None = None
    guided_grammar: StrictStr | None = None
    response_format: dict | None = None
    kv_transfer_params: KVTransferParams | None = None  # disaggregation: set by the proxy on the decode hop
    structured_outputs: dict | None = None
    pin_ttl_s: Number | None = None  # pin the prompt's full blocks for this long (jaxpaged extension)

    def sampling_params(self, *, default_max_tokens: int, logprobs: int | None,
                        max_tokens: int | None = None, prompt_logprobs: int | None = None,
                        constraint=None) -> SamplingParams:
        """The engine's SamplingParams (ValueError naming the field when a value is out of range or refused).

        `constraint` (a tool choice's schema) replaces the request's own structured-output fields.
        """
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if max_tokens is None:
            max_tokens = default_max_tokens if self.max_tokens is None else self.max_tokens
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, seed=self.seed,
            max_tokens=max_tokens,
            stop=stop, stop_token_ids=list(self.stop_token_ids or []), ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output, logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if prompt_logprobs is None else prompt_logprobs,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, logit_bias=self.logit_bias, min_tokens=self.min_tokens,
            bad_words=list(self.bad_words or []), min_p=self.min_p, allowed_token_ids=self.allowed_token_ids,
            structured_outputs=constraint if constraint is not None else self.structured_outputs_params(),
            output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY,
            kv_source=self.kv_transfer_params.remote_address if self.kv_transfer_params is not None else None)

    def structured_outputs_params(self):
        """The request's structured-output constraint (None: free text); ValueError naming the field."""
        return structured_outputs_of(response_format=self.response_format, guided_json=self.guided_json,
                                     guided_regex=self.guided_regex, guided_choice=self.guided_choice,
                                     guided_grammar=self.guided_grammar, structured_outputs=self.structured_outputs)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionRequest(_SamplingFields):
    """`POST /v1/completions`."""

    prompt: StrictStr | TokenIds | Strings | Annotated[list[TokenIds], Field(fail_fast=True)]
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None

    def completion_params(self, default_max_tokens: int) -> SamplingParams:
        """SamplingParams as vLLM makes them: `echo` with `logprobs` asks for the prompt's logprobs too;
        `echo` with `max_tokens=0` generates one token, which the response leaves out."""
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError(f"best_of is not supported by this server (only best_of == n), got {self.best_of}")
        if self.suffix:
            raise ValueError("suffix is not supported by this server")
        prompt_logprobs = self.logprobs if self.echo and self.logprobs is not None else None
        if prompt_logprobs is not None and self.prompt_logprobs is not None:
            prompt_logprobs = max(prompt_logprobs, self.prompt_logprobs)
        max_tokens = 1 if self.echo_only else None
        return self.sampling_params(default_max_tokens=default_max_tokens, logprobs=self.logprobs,
                                    max_tokens=max_tokens, prompt_logprobs=prompt_logprobs)

    @property
    def echo_only(self) -> bool:
        """`echo` with `max_tokens=0`: the response is the prompt alone."""
        return self.echo and self.max_tokens == 0

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
    content: StrictStr | Annotated[list[dict], Field(fail_fast=True)] | None = None
    tool_calls: Annotated[list[dict], Field(fail_fast=True)] | None = None  # an assistant's earlier calls
    tool_call_id: StrictStr | None = None  # a `tool` message: the call it answers
    name: StrictStr | None = None

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

    best_of: ClassVar[None] = None  # no such field in chat (a sent one is ignored): declared for the limits
    messages: list[ChatMessage] = Field(min_length=1, fail_fast=True)
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    add_generation_prompt: StrictBool = True
    tools: Annotated[list[dict], Field(fail_fast=True)] | None = None
    tool_choice: StrictStr | dict | None = None
    parallel_tool_calls: StrictBool = True

    def logprobs_k(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0


class TokenizeRequest(BaseModel):
    """`POST /tokenize`: a prompt or chat messages."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: Annotated[list[ChatMessage], Field(fail_fast=True)] | None = None
    add_generation_prompt: StrictBool = True


class PinRequest(BaseModel):
    """`POST /v1/cache/pin`: keep a prefix's blocks for `ttl_s` seconds (0 unpins); a prompt or messages."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    prompt: StrictStr | TokenIds | None = None
    messages: Annotated[list[ChatMessage], Field(fail_fast=True)] | None = None
    add_generation_prompt: StrictBool = True
    cache_salt: StrictStr | None = None
    tenant: StrictStr | None = None  # with API keys, an admin's pin in this tenant's namespace
    ttl_s: Number


class DetokenizeRequest(BaseModel):
    """`POST /detokenize`."""

    model_config = ConfigDict(extra="ignore")
    model: StrictStr | None = None
    tokens: TokenIds


ObjectName = Literal["text_completion", "chat.completion"]
