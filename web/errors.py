"""One error shape for every failure: ``{"error", "message", "details"}``."""

from __future__ import annotations

import logging
from typing import cast

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from tasks.jobs.model.errors import (
    JobConflict,
    JobNotFound,
    KeelError,
    QuotaExceeded,
    Refused,
    Unavailable,
)
from tasks.platform.broker import UNREACHABLE_ERRORS as BROKER_UNAVAILABLE
from tasks.platform.db import STORE_UNAVAILABLE

log = logging.getLogger(__name__)

HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
    500: "internal_error",
    503: "unavailable",
}
RETRY_AFTER_S = 5

# How each of Keel's errors answers over HTTP: the nearest class in its MRO decides.
# A refusal is the caller's (4xx); ``Unavailable`` is a part that is away (503, with
# Retry-After); anything else of Keel's reaching a view — ``ControlFlow`` included — is a
# bug, answered 500 and logged.
STATUSES: dict[type[KeelError], int] = {
    JobNotFound: 404,
    JobConflict: 409,
    QuotaExceeded: 429,
    Refused: 400,
    Unavailable: 503,
}
# The codes of the families themselves say nothing a status does not: the HTTP name is used.
_GENERIC_CODES = {"keel_error", "refused", "unavailable", "control_flow"}


class ApiError(KeelError):
    """An HTTP error of the web layer itself (authentication, parsing, ...)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        details: list | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message, details=details)
        self.status = status
        self.code = code or HTTP_CODES.get(status, "error")
        self.headers = headers or {}


def status_of(error: KeelError) -> int:
    """The HTTP status of one of Keel's errors (``STATUSES``; an ``ApiError`` says its own)."""
    if isinstance(error, ApiError):
        return error.status
    for klass in type(error).__mro__:
        if klass in STATUSES:
            return STATUSES[klass]
    return 500


def code_of(error: KeelError) -> str:
    """The ``error`` field: the error's own code, or the status's name for a generic one."""
    if error.code in _GENERIC_CODES:
        return HTTP_CODES.get(status_of(error), "error")
    return error.code


def headers_of(error: KeelError) -> dict:
    if isinstance(error, ApiError):
        return error.headers
    if isinstance(error, Unavailable):
        return {"Retry-After": str(RETRY_AFTER_S)}
    return {}


def error_response(error: KeelError):
    """The one JSON shape, for every error of the tree."""
    status = status_of(error)
    if status == 500:
        log.error("%s reached the API: %s", type(error).__name__, error)
        body = {"error": "internal_error", "message": "internal error", "details": []}
        return jsonify(body), 500, {}
    body = {"error": code_of(error), "message": str(error), "details": error.details}
    return jsonify(body), status, headers_of(error)


def init_app(app: Flask) -> None:
    @app.errorhandler(KeelError)
    def _keel(error: KeelError):
        """Every Keel error answers by ``STATUSES`` (an ``ApiError`` by its own status)."""
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException):
        status = error.code or 500
        headers = {}
        if status == 405 and error.valid_methods:  # type: ignore[attr-defined]
            headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
        return error_response(ApiError(status, error.description or error.name, headers=headers))

    # Down, hung past the request's deadline (tasks.platform.deadline), or out of
    # connections: the same errors a worker gives its delivery back for.
    for store_error in STORE_UNAVAILABLE:
        app.register_error_handler(
            cast(type[Exception], store_error), _unavailable("the job store")
        )
    for broker_error in BROKER_UNAVAILABLE:
        app.register_error_handler(cast(type[Exception], broker_error), _unavailable("the broker"))

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, "internal error"))


def _unavailable(part: str):
    def answer(error: Exception):
        log.warning("%s is unavailable: %s", part, str(error).splitlines()[0] if str(error) else "")
        return error_response(
            ApiError(
                503,
                f"{part} is unavailable, try again shortly",
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )
        )

    return answer
