"""The dashboard at ``/ui``: what only Keel knows, in a browser (Flower shows the workers).

Server-rendered pages, one module per page — ``jobs``, ``schedulers``,
``campaigns``, ``queues``, ``webhooks``, ``key_limits`` and ``limit_forms`` (the platform
role's: ``platform``) — plus ``signin``; a little JavaScript for live
updates; templates and assets inside the package (``templates/ui``,
``static/ui``), so there is no CDN and no build step.

Who sees what is the API's business: a page asks ``web.ui.session`` for the
signed-in principal and then calls the same functions as the API's views
(``web.jobs.read_job``, ``web.schedulers.upsert_for``, ...). Every form
carries a CSRF token (flask-wtf's ``CSRFProtect``, checked for the
dashboard's unsafe methods only: the API takes bearer tokens, which a
browser never sends by itself). Pages answer errors with a page a person
can read; the JSON and partial endpoints the pages fetch answer with the
API's JSON error shape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from flask import Blueprint, Flask, Response, g, has_request_context, render_template, request
from flask.sessions import SecureCookieSessionInterface
from flask_wtf.csrf import CSRFError, CSRFProtect
from werkzeug.exceptions import HTTPException

from tasks.jobs.model.errors import KeelError
from tasks.platform.broker import UNREACHABLE_ERRORS as BROKER_UNAVAILABLE
from tasks.platform.config import get_settings
from tasks.platform.db import STORE_UNAVAILABLE
from web.errors import RETRY_AFTER_S, ApiError, code_of, error_response, status_of

log = logging.getLogger(__name__)

bp = Blueprint(
    "ui",
    __name__,
    url_prefix="/ui",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)
csrf = CSRFProtect()
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
HSTS_MAX_AGE_S = 365 * 86_400  # sent on HTTPS responses only
# Scripts and styles come from the package only; nothing may frame a page.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
)


def init_app(app: Flask) -> None:
    """The dashboard's routes, its session cookie and its CSRF protection."""
    from tasks.platform import catalog
    from web.ui import (  # noqa: F401  (routes)
        bulk,
        jobs,
        key_limits,
        limit_forms,
        new_job,
        oidc,
        queues,
        schedulers,
        signin,
        webhooks,
    )

    if catalog.enabled("notifications"):  # its module imports the notifications app
        from web.ui import campaigns  # noqa: F401  (routes)

    settings = get_settings()
    app.config.setdefault("KEEL_UI_SESSION_S", settings.ui_session_s)
    app.config.setdefault("KEEL_UI_IDLE_S", settings.ui_idle_s)
    if settings.ui_secure_cookie:  # else Secure on HTTPS requests (``SessionCookie``)
        app.config["SESSION_COOKIE_SECURE"] = True
    app.session_interface = SessionCookie()
    app.config.update(
        SESSION_COOKIE_NAME="keel_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=app.config["KEEL_UI_SESSION_S"],
        WTF_CSRF_CHECK_DEFAULT=False,  # the dashboard's forms only (``_protect``)
        WTF_CSRF_TIME_LIMIT=None,  # the token lives as long as the session
    )
    csrf.init_app(app)
    app.register_blueprint(bp)


class SessionCookie(SecureCookieSessionInterface):
    """Flask's signed cookie, ``Secure`` whenever the request came over HTTPS (gunicorn
    trusts ``X-Forwarded-Proto`` from its ``forwarded_allow_ips``), or always with
    ``KEEL_UI_SECURE_COOKIE``."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or (
            has_request_context() and request.is_secure
        )


@bp.before_request
def _protect() -> None:
    if request.method not in SAFE_METHODS:
        csrf.protect()


@bp.after_request
def _headers(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    # Same-origin requests carry the Referer that flask-wtf's HTTPS check requires; no
    # other origin is told a page's address (nor a sign-in link's token).
    response.headers["Referrer-Policy"] = "same-origin"
    if request.is_secure:
        response.headers["Strict-Transport-Security"] = f"max-age={HSTS_MAX_AGE_S}"
    if request.endpoint != "ui.static":
        response.headers["Cache-Control"] = "no-store"  # a tenant's records
    return response


def wants_page() -> bool:
    """A person's browser asking for a page (else a script fetching JSON or a partial)."""
    best = request.accept_mimetypes.best_match(["application/json", "text/html"])
    return best == "text/html" and request.accept_mimetypes["text/html"] > 0


def error_page(status: int, message: str, code: str, details: list | None = None) -> Any:
    from web.ui.session import SignedOut

    if code == SignedOut.CODE:
        shown = None if message == SignedOut.DEFAULT else message  # the page says it already
        return render_template("ui/signin.html", status=status, message=shown), status
    page = render_template(
        "ui/error.html", status=status, message=message, code=code, details=details or []
    )
    return page, status


@bp.errorhandler(KeelError)
def _keel_error(error: KeelError) -> Any:
    if not wants_page():
        return error_response(error)
    status = status_of(error)
    if status == 500:
        log.error("%s reached the dashboard: %s", type(error).__name__, error)
        return error_page(500, "internal error", "internal_error")
    # a refused query or form names the field and why (the API's details)
    return error_page(status, str(error), code_of(error), error.details if status < 500 else None)


@bp.errorhandler(CSRFError)
def _csrf_error(error: CSRFError) -> Any:
    message = f"the form was refused: {error.description} Reload the page and try again."
    return _keel_error(ApiError(400, message, code="csrf_failed"))


@bp.errorhandler(HTTPException)
def _http_error(error: HTTPException) -> Any:
    return _keel_error(ApiError(error.code or 500, error.description or error.name))


def _unavailable(part: str) -> Callable[[Exception], Any]:
    def answer(error: Exception) -> Any:
        log.warning("%s is unavailable: %s", part, type(error).__name__)
        message = f"{part} is unavailable, try again shortly"
        return _keel_error(ApiError(503, message, headers={"Retry-After": str(RETRY_AFTER_S)}))

    return answer


# The same outages the API answers 503 for, as a page a person can read.
for _part, _errors in (("the job store", STORE_UNAVAILABLE), ("the broker", BROKER_UNAVAILABLE)):
    for _error in _errors:
        bp.register_error_handler(cast(type[Exception], _error), _unavailable(_part))


@bp.errorhandler(Exception)
def _unexpected(error: Exception) -> Any:
    log.exception("unhandled error on a dashboard page")
    return _keel_error(ApiError(500, "internal error"))


@bp.context_processor
def _dashboard_context() -> dict[str, Any]:
    from tasks.platform import catalog
    from web import hosts

    principal = g.get("principal")
    return {
        "principal": principal,
        # Flower is a system-wide admin tool (every tenant's tasks, the workers): its link is
        # for operators and the platform role only. Configured, never built from the Host header.
        "flower_url": hosts.flower_url()
        if principal and (principal.operator or principal.platform)
        else None,
        "campaigns_on": catalog.enabled("notifications"),
        "oidc_enabled": oidc_enabled(),
    }


def oidc_enabled() -> bool:
    from web.ui.oidc import enabled

    return enabled()
