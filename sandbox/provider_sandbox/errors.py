"""What the sandbox answers when it refuses: ``{"error", "message", "details"}``.

The same body shape as Keel's API, so clients see one shape everywhere; the
sandbox keeps its own error root all the same, since it plays a third party
and imports nothing of Keel.
"""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

log = logging.getLogger(__name__)


class ProviderError(Exception):
    """The provider refused the request."""

    status = 400
    code = "bad_request"

    def __init__(
        self,
        message: str | None = None,
        *,
        details: list | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message or (self.__doc__ or "").strip())
        self.details = details or []
        self.headers = headers or {}


class InvalidRequest(ProviderError):
    """The request body or query is not what this endpoint takes."""

    code = "invalid_request"


class TooManyMessages(InvalidRequest):
    """At most 1,000 messages may be added per request."""

    code = "too_many_messages"


class AdminKeyRequired(ProviderError):
    """This route needs the sandbox's admin key (KEEL_SANDBOX_ADMIN_KEY) in X-Sandbox-Admin-Key."""

    status = 401
    code = "unauthorized"


class JsonOnly(ProviderError):
    """This route takes application/json bodies only."""

    status = 415
    code = "unsupported_media_type"


class GroupNotFound(ProviderError):
    """No such group."""

    status = 404
    code = "group_not_found"


class GroupAlreadySent(ProviderError):
    """The group was already sent; it takes no more messages and no second send."""

    status = 409
    code = "group_already_sent"


class GroupNotEmpty(ProviderError):
    """Only an empty group that was never sent can be deleted."""

    status = 409
    code = "group_not_empty"


class RateLimited(ProviderError):
    """Too many requests; retry after the number of seconds in ``Retry-After``."""

    status = 429
    code = "rate_limited"


class Unavailable(ProviderError):
    """The provider is temporarily unavailable; retry later."""

    status = 503
    code = "unavailable"


def error_body(code: str, message: str, details: list | None = None) -> dict:
    return {"error": code, "message": message, "details": details or []}


def error_response(error: ProviderError):
    body = error_body(error.code, str(error), error.details)
    return jsonify(body), error.status, error.headers


def init_app(app: Flask) -> None:
    """Answer every failure, including werkzeug's own 404/405/413, as JSON."""

    @app.errorhandler(ProviderError)
    def _provider(error: ProviderError):
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException):
        status = error.code or 500
        code = (error.name or "error").lower().replace(" ", "_")
        headers = {}
        if status == 405 and getattr(error, "valid_methods", None):
            headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
        return jsonify(error_body(code, error.description or error.name)), status, headers

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        log.exception("unhandled error in the provider sandbox")
        return jsonify(error_body("internal_error", "internal error")), 500
