"""One error shape for every failure: ``{"error", "message", "details"}``."""

from __future__ import annotations

import logging
from typing import cast

from flask import Flask, jsonify
from werkzeug.exceptions import HTTPException

from tasks.broker import UNREACHABLE_ERRORS as BROKER_UNAVAILABLE
from tasks.db import STORE_UNAVAILABLE
from tasks.jobs.model.errors import KeelError

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
        super().__init__(message, details=details, headers=headers)
        self.status = status
        self.code = code or HTTP_CODES.get(status, "error")


def error_response(error: KeelError):
    """The one JSON shape, for every error of the tree."""
    code = error.code if error.code != KeelError.code else HTTP_CODES.get(error.status, "error")
    body = {"error": code, "message": str(error), "details": error.details}
    return jsonify(body), error.status, error.headers


def init_app(app: Flask) -> None:
    @app.errorhandler(KeelError)
    def _keel(error: KeelError):
        """Every Keel error carries its own status and code (``ApiError`` included)."""
        return error_response(error)

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException):
        status = error.code or 500
        headers = {}
        if status == 405 and error.valid_methods:  # type: ignore[attr-defined]
            headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
        return error_response(ApiError(status, error.description or error.name, headers=headers))

    # Down, hung past the request's deadline (tasks.deadline), or out of
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
