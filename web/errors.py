"""One error shape for every failure: ``{"error", "message", "details"}``."""

from __future__ import annotations

import logging

from flask import Flask, jsonify
from sqlalchemy.exc import OperationalError as DatabaseDown
from werkzeug.exceptions import HTTPException

from tasks.jobs.errors import KeelError

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


class ApiError(Exception):
    """An HTTP error answered in the one JSON shape."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        details: list | None = None,
        headers: dict | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or HTTP_CODES.get(status, "error")
        self.message = message
        self.details = details or []
        self.headers = headers or {}


def error_response(error: ApiError):
    body = {"error": error.code, "message": error.message, "details": error.details}
    return jsonify(body), error.status, error.headers


def init_app(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api(error: ApiError):
        return error_response(error)

    @app.errorhandler(KeelError)
    def _keel(error: KeelError):
        """Keel's errors carry their own status and code."""
        code = None if error.code == KeelError.code else error.code
        return error_response(ApiError(error.status, str(error), code=code,
                                       details=error.details))  # fmt: skip

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException):
        status = error.code or 500
        headers = {}
        if status == 405 and error.valid_methods:  # type: ignore[attr-defined]
            headers["Allow"] = ", ".join(error.valid_methods)  # type: ignore[attr-defined]
        return error_response(ApiError(status, error.description or error.name, headers=headers))

    @app.errorhandler(DatabaseDown)
    def _database(error: DatabaseDown):
        log.warning("database unavailable: %s", error)
        return error_response(
            ApiError(
                503, "the job store is unavailable, try again shortly", headers={"Retry-After": "5"}
            )
        )

    @app.errorhandler(Exception)
    def _unexpected(error: Exception):
        log.exception("unhandled error")
        return error_response(ApiError(500, "internal error"))
