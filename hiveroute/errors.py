"""One small hierarchy of errors that map onto OpenAI-style JSON error bodies.

Every error a client can cause says what was wrong and what to do; the gateway turns each
into an HTTP status and `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any


class HiverouteError(Exception):
    """Base of every error hiveroute raises on purpose."""

    status: int = 500
    error_type: str = "internal_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def to_json(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, param=self.param, code=self.code)


class BadRequest(HiverouteError):
    status = 400
    error_type = "invalid_request_error"


class Unauthorized(HiverouteError):
    status = 401
    error_type = "authentication_error"


class Forbidden(HiverouteError):
    status = 403
    error_type = "permission_error"


class NotFound(HiverouteError):
    status = 404
    error_type = "not_found_error"


class Conflict(HiverouteError):
    status = 409
    error_type = "conflict_error"


class PayloadTooLarge(HiverouteError):
    status = 413
    error_type = "invalid_request_error"
    code = "payload_too_large"


class TooManyRequests(HiverouteError):
    status = 429
    error_type = "rate_limit_error"
    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float = 1.0):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class NoEngineAvailable(HiverouteError):
    status = 503
    error_type = "service_unavailable"
    code = "no_engine_available"


class UpstreamError(HiverouteError):
    status = 502
    error_type = "upstream_error"


class ConfigError(HiverouteError):
    """Bad configuration: raised at start-up, printed, and the process exits with status 2."""


def error_body(
    message: str, error_type: str, *, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error shape, which the official clients parse into their exceptions."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}
