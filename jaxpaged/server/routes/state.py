"""`ServerState`: what every route reads — the `EngineClient`, the served model's name and chat template,
and the request-level steps the generating routes share (model check, prompt rendering, queueing)."""

from __future__ import annotations

import dataclasses
import functools

from prometheus_client import CollectorRegistry

from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.engine_client import EngineClient
from jaxpaged.server.limits import RequestLimits
from jaxpaged.server.streams import close_streams
from jaxpaged.engine.pin_quota import PinQuota
from jaxpaged.cache.namespaces import Namespace
from jaxpaged.server.tenants import (PermissionDenied, Tenant, TenantKeys, admission_limits, pin_quota,
                                     tenant_cache_salt, tenant_namespace)
from jaxpaged.server.tools import template_messages


class ModelNotFound(Exception):
    """The request names a model this server does not serve."""


@dataclasses.dataclass
class ServerState:
    """One server's engine client and naming (see the module docstring)."""

    client: EngineClient
    served_model_name: str
    chat_template: ChatTemplate
    registry: CollectorRegistry
    max_prompts_per_request: int | None = None  # None: derived from the engine's waiting queue (limits.py)
    keys: TenantKeys | None = None  # None: no authentication, the client's cache_salt is used as sent

    @functools.cached_property
    def limits(self) -> RequestLimits:
        """What one request may ask for, from the engine's sizes (read once the client knows its model)."""
        return RequestLimits.of(self.client.model_info, self.max_prompts_per_request)

    def check_request(self, body, prompts) -> None:
        """ValueError naming the field and its limit when the request asks for more than one request may;
        runs before anything is built, pinned or queued for it."""
        self.limits.check_sampling(body)
        self.limits.check_prompts(prompts)

    def kv_transfer_fields(self) -> dict:
        """What a final response adds on a prefill engine: where its blocks are, for the decode hop
        (vLLM's ``kv_transfer_params``; the proxy passes it on); nothing elsewhere."""
        address = self.client.model_info.kv_address
        return {} if address is None else {"kv_transfer_params": {"remote_address": address}}

    def check_model(self, name: str | None) -> None:
        """ModelNotFound (a 404) unless `name` is absent or the served model's."""
        if name is not None and name != self.served_model_name:
            raise ModelNotFound(name)

    def render_chat(self, body, tools: list[dict] | None = None) -> str:
        """The body's `messages` (and `tools`) as one prompt text, by the chat template."""
        return self.chat_template.render(template_messages(body.messages), tools=tools,
                                         add_generation_prompt=body.add_generation_prompt)

    def prompt_or_messages(self, body, what: str):
        """The body's `prompt`, or its `messages` rendered by the chat template (exactly one must be set)."""
        self.check_model(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise ValueError(f"{what} needs exactly one of 'prompt' and 'messages'")
        return body.prompt if body.prompt is not None else self.render_chat(body)

    def cache_salt(self, request, client_salt: str | None, tenant_name: str | None = None) -> str | None:
        """The salt the request's blocks are hashed with: with API keys, its tenant's namespace (tenants.py),
        or with ``tenant_name`` (admins only) that tenant's; without keys, the client's ``cache_salt`` as sent."""
        if self.keys is None:
            return client_salt
        tenant: Tenant = request.state.tenant
        if tenant_name is not None and tenant_name != tenant.name:
            if not tenant.is_admin:
                raise PermissionDenied(f"tenant: only an admin key may act in another tenant's namespace "
                                       f"({tenant_name!r})")
            if tenant_name not in self.keys.tenant_names:
                raise ValueError(f"tenant: no tenant named {tenant_name!r} is configured")
            tenant = Tenant(tenant_name)
        return tenant_cache_salt(tenant, client_salt, self.keys.allow_sub_namespaces)

    def reset_namespace(self, request) -> Namespace | None:
        """What the request's ``/reset_prefix_cache`` drops: its tenant's namespace for a user key, None
        (everything) for an admin key or without API keys."""
        if self.keys is None or request.state.tenant.is_admin:
            return None
        return tenant_namespace(request.state.tenant)

    def pin_quota(self, request) -> PinQuota | None:
        """What the request's pins are charged to: its tenant (None without API keys)."""
        return None if self.keys is None else pin_quota(request.state.tenant)

    async def pin_prompts(self, request, body, prompts, cache_salt: str | None) -> None:
        """The request's `pin_ttl_s`: pin each prompt's blocks (in the namespace of ``cache_salt``, charged to
        its tenant) before it is queued."""
        if body.pin_ttl_s is not None:
            for prompt in prompts:
                await self.client.pin_prefix(prompt, body.pin_ttl_s, cache_salt=cache_salt,
                                             quota=self.pin_quota(request))

    async def submit(self, request, base_id: str, prompts, params, cache_salt, priority: int = 0) -> list:
        """Queue every prompt (with its ``priority`` and the request's tenant); if one is refused (or the client
        leaves), abort those already queued."""
        tenant = None if self.keys is None else request.state.tenant.name
        limits = None if self.keys is None else admission_limits(request.state.tenant)
        streams = []
        try:
            for i, prompt in enumerate(prompts):
                streams.append(await self.client.add_request(f"{base_id}-{i}", prompt, params,
                                                             cache_salt=cache_salt, priority=priority,
                                                             tenant=tenant, limits=limits))
        except BaseException:
            close_streams(streams)
            raise
        return streams
