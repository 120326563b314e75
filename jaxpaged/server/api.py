"""The FastAPI app: OpenAI-compatible completions and chat, models, health, metrics, tokenizer, cache reset.

Every client's request goes into the one `EngineClient` (engine_client.py). Errors follow the
OpenAI shape, `{"error": {"message", "type", "param", "code"}}`: 400 for bad
input (the engine's ValueErrors, malformed JSON, wrong types), 404 for an
unknown model, 401 / 403 for a missing key or a role that may not (auth.py, tenants.py), 429 with
`Retry-After` past a tenant's request limits (tenant_admission.py) or the pin bounds, 413 for a body over
`max_request_body_bytes`, 503 with `Retry-After` when the waiting queue is full or the engine loop is gone.

No client can stop the engine, or keep it busy after leaving: a client that
disconnects (streaming or not) has every request it queued aborted, which
frees its blocks, and so does a multi-prompt request refused at a later
prompt. A stream whose engine died ends with an error event (an OpenAI error
object in a `data:` line) and no `[DONE]`; a non-streaming request gets 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.exceptions import HTTPException as StarletteHTTPException

from jaxpaged.engine.pin_quota import PinQuotaError
from jaxpaged.server.auth import Authenticate
from jaxpaged.server.request_stream import EngineDeadError, QueueFullError, TenantLimitError
from jaxpaged.server.body_limit import DEFAULT_MAX_REQUEST_BODY_BYTES, BodyLimit
from jaxpaged.server.chat import ChatTemplate
from jaxpaged.server.engine_client import EngineClient
from jaxpaged.server.errors import error_response as _error
from jaxpaged.server.http_metrics import CountRequests
from jaxpaged.server.protocol import ChatCompletionRequest, CompletionRequest, PinRequest
from jaxpaged.server.routes import admin, cache, chat, completions, health, tokenize
from jaxpaged.server.routes.state import ModelNotFound, ServerState
from jaxpaged.server.tenants import PermissionDenied, TenantKeys

RETRY_AFTER_S = 1
log = logging.getLogger(__name__)


def build_app(client: EngineClient, *, served_model_name: str, chat_template: ChatTemplate | None = None,
              registry: CollectorRegistry | None = None, enable_debug_endpoints: bool = False,
              max_request_body_bytes: int | None = DEFAULT_MAX_REQUEST_BODY_BYTES,
              max_prompts_per_request: int | None = None, keys: TenantKeys | None = None) -> FastAPI:
    """The app over a started-or-not `EngineClient` (`AsyncEngine`, `CoreClient`, `ReplicaPool`); it starts and
    stops with the app's lifespan. The routes are jaxpaged/server/routes/'s modules.

    `max_request_body_bytes` refuses larger bodies with a 413 before they are parsed (None: no limit).
    `max_prompts_per_request` bounds the prompts of one completion request (None: a quarter of the engine's
    waiting queue; limits.py has every per-request limit).
    `keys`: the API keys and their tenants (tenants.py); None: every client is trusted, as without keys.
    """
    state = ServerState(client, served_model_name, chat_template or ChatTemplate(), registry or CollectorRegistry(),
                        max_prompts_per_request, keys)
    if keys is None:
        log.warning("no API key configured: every client may use every route, and clients share the prefix "
                    "cache unless they send a cache_salt (--api_key / --api_keys_file)")
    else:
        log.info("API keys: %d keys, %d tenants; /health and /metrics are open", len(keys.keys),
                 len(keys.tenant_names))

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not client.is_running and client.error is None:
            client.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, client.shutdown)

    app = FastAPI(title="jaxpaged", lifespan=lifespan)
    modules = (completions, chat, tokenize, cache, health) + ((admin,) if enable_debug_endpoints else ())
    routers = [module.router(state) for module in modules]
    app.add_middleware(BodyLimit, max_bytes=max_request_body_bytes,  # before anything reads the body
                       max_json_values=lambda: state.limits.max_json_values)
    if keys is not None:  # outside BodyLimit: no byte of a client's body is read before its key is checked
        app.add_middleware(Authenticate, keys=keys)
    # outside them all, so their refusals are counted too
    _count_requests(app, state.registry, frozenset(route.path for r in routers for route in r.routes))
    _handle_errors(app)
    for router in routers:
        app.include_router(router)
    return app


def _count_requests(app: FastAPI, registry: CollectorRegistry, route_paths: frozenset[str]) -> None:
    """HTTP request counts and latencies by route (one of `route_paths`, or ``unmatched``), into `registry`."""
    http_requests = Counter("jaxpaged:http_requests", "HTTP requests by method, path and status.",
                            ["method", "path", "status"], registry=registry)
    http_latency = Histogram("jaxpaged:http_request_duration_seconds", "Time to the response's start, by path.",
                             ["path"], registry=registry)

    app.add_middleware(CountRequests, requests=http_requests, latency=http_latency, route_paths=route_paths)


def _handle_errors(app: FastAPI) -> None:
    """Every refusal in the OpenAI error shape, with its status (see the module docstring)."""

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError):
        err = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request", "type": ""}
        if err.get("type") == "json_invalid":
            return _error(400, f"malformed JSON body: {err['msg']}", "BadRequestError")
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        param = ".".join(loc) or None
        message = f"{param}: {err['msg']}" if param else err["msg"]
        return _error(400, message, "BadRequestError", param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        # FastAPI's own refusals (a body that is not UTF-8, an unknown path, a wrong method), OpenAI-shaped
        kind = "NotFoundError" if exc.status_code == 404 else "BadRequestError"
        return _error(exc.status_code, str(exc.detail), kind, headers=exc.headers)

    @app.exception_handler(ValueError)
    async def bad_value(request: Request, exc: ValueError):
        return _error(400, str(exc), "BadRequestError", _field_named(str(exc)))

    @app.exception_handler(TypeError)
    async def bad_type(request: Request, exc: TypeError):
        return _error(400, str(exc), "BadRequestError", _field_named(str(exc)))

    @app.exception_handler(ModelNotFound)
    async def no_model(request: Request, exc: ModelNotFound):
        return _error(404, f"The model `{exc}` does not exist.", "NotFoundError", "model")

    @app.exception_handler(PinQuotaError)
    async def over_pin_quota(request: Request, exc: PinQuotaError):
        return _error(429, str(exc), "RateLimitError", "ttl_s", headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(PermissionDenied)
    async def not_allowed(request: Request, exc: PermissionDenied):
        return _error(403, str(exc), "PermissionDeniedError")

    @app.exception_handler(TenantLimitError)
    async def over_tenant_limit(request: Request, exc: TenantLimitError):
        return _error(429, str(exc), "RateLimitError", headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError):
        return _error(503, str(exc), "ServiceUnavailableError", headers={"Retry-After": str(RETRY_AFTER_S)})

    @app.exception_handler(EngineDeadError)
    async def engine_dead(request: Request, exc: EngineDeadError):
        return _error(503, str(exc), "ServiceUnavailableError")


def _field_named(message: str) -> str | None:
    """The request field an engine error message starts with ("top_p must be ..."), if any."""
    first = message.split(" ", 1)[0].rstrip(":")
    fields = (set(CompletionRequest.model_fields) | set(ChatCompletionRequest.model_fields)
              | set(PinRequest.model_fields) | {"prompt"})
    return first if first in fields else None
