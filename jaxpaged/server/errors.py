"""OpenAI-shaped error bodies, `{"error": {"message", "type", "param", "code"}}`, for responses and SSE events."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from jaxpaged.server.request_stream import EngineDeadError, QueueFullError, TenantLimitError


def error_body(status: int, message: str, kind: str, param: str | None = None) -> dict:
    """The error object. Text from the client (a model name with a lone surrogate) cannot be encoded as
    UTF-8, so such characters are written as escapes rather than breaking the response."""
    def text(value: str | None) -> str | None:
        return None if value is None else value.encode("utf-8", "backslashreplace").decode("utf-8")
    return {"error": {"message": text(message), "type": kind, "param": text(param), "code": status}}


def error_response(status: int, message: str, kind: str, param: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    """The error as an HTTP response."""
    return JSONResponse(error_body(status, message, kind, param), status_code=status, headers=headers)


def status_of(err: BaseException) -> tuple[int, str]:
    """The HTTP status and OpenAI error type of a failure."""
    if isinstance(err, (EngineDeadError, QueueFullError)):
        return 503, "ServiceUnavailableError"
    if isinstance(err, TenantLimitError):
        return 429, "RateLimitError"
    if isinstance(err, (ValueError, TypeError)):
        return 400, "BadRequestError"
    return 500, "InternalServerError"
