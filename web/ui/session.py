"""Signing in to the dashboard: one-time links, and the session cookie they set.

A browser cannot send a bearer token, so ``keel ui-link`` prints a URL whose
last segment is a link token: tenant, user, roles, a random nonce and a
lifetime, signed with ``KEEL_SECRET_KEY`` under a salt of its own (no other
signature of Keel's verifies as one). The first time the link is opened, its
nonce is marked used in Redis (``SET NX``, kept as long as the link could
still be valid), so a second use — a forwarded link, a browser history
entry, a proxy log — is refused. While Redis does not answer, links are
refused too: a link that could be used twice is not one-time.

The session is Flask's signed cookie (``HttpOnly``, ``SameSite=Strict``, see
``web.ui.init_app``) holding the same identity and an expiry. Each request
turns it back into a ``web.auth.Principal`` and passes ``web.auth.admit`` —
the API's rate limit and role check — and the pages then call the API's own
owner-scoped operations (``web.jobs.read_job`` and its siblings), so what a
session may see and do is decided by the same code as for a token.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from flask import current_app, session
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from web import auth
from web.api import check_path_params, path_param_schema
from web.auth import Principal
from web.errors import ApiError

LINK_SALT = "keel.ui-link"
DEFAULT_LINK_TTL_S = 300
MAX_LINK_TTL_S = 3600
NONCE_KEY = "keel:ui-link:{nonce}"
SESSION_KEY = "keel"
MAX_LINK_BYTES = 2048


class SignedOut(ApiError):
    """No valid dashboard session: sign in with a link from ``keel ui-link``."""

    DEFAULT = "sign in with a link from `keel ui-link`"
    CODE = "signed_out"

    def __init__(self, message: str = DEFAULT) -> None:
        super().__init__(401, message, code=self.CODE)


def _serializer(secret: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(secret, salt=LINK_SALT)


def issue_link(
    secret: str, tenant: str, user: str, roles: list[str], ttl_s: int = DEFAULT_LINK_TTL_S
) -> str:
    """A link token for ``/ui/login/<token>``, valid once, for ``ttl_s`` seconds."""
    if not 1 <= ttl_s <= MAX_LINK_TTL_S:
        raise ValueError(f"a sign-in link lives 1..{MAX_LINK_TTL_S} s")
    claims = {"t": tenant, "u": user, "r": roles, "n": secrets.token_urlsafe(18), "ttl": ttl_s}
    return _serializer(secret).dumps(claims)


def _claims(token: str) -> dict[str, Any]:
    if len(token) > MAX_LINK_BYTES:
        raise SignedOut("this sign-in link is not valid")
    serializer = _serializer(current_app.config["SECRET_KEY"])
    try:
        claims = serializer.loads(token, max_age=MAX_LINK_TTL_S)
        if not isinstance(claims, dict) or not isinstance(claims.get("ttl"), int):
            raise BadSignature("unexpected claims")
        serializer.loads(token, max_age=claims["ttl"])  # the link's own lifetime
    except SignatureExpired:
        raise SignedOut("this sign-in link has expired: ask for a new one") from None
    except BadSignature:
        raise SignedOut("this sign-in link is not valid") from None
    return claims


def _principal(tenant: Any, user: Any, roles: Any) -> Principal:
    if not auth.is_id(tenant) or not auth.is_id(user):
        raise SignedOut()
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise SignedOut()
    return Principal(tenant, user, tuple(roles))


def _spend(nonce: str, ttl_s: int) -> bool:
    """Mark the link's nonce used; False if it already was."""
    from tasks import broker

    if broker.unreachable():
        raise ApiError(503, "sign-in is unavailable while Redis does not answer")
    started = time.monotonic()
    try:
        first = broker.redis_client().set(NONCE_KEY.format(nonce=nonce), 1, nx=True, ex=ttl_s + 60)
    except broker.UNREACHABLE_ERRORS as exc:
        broker.failed(exc, started)
        raise ApiError(503, "sign-in is unavailable while Redis does not answer") from None
    return bool(first)


def redeem_link(token: str) -> Principal:
    """The identity a link token carries, spending it (``SignedOut`` if it cannot be used)."""
    claims = _claims(token)
    principal = _principal(claims.get("t"), claims.get("u"), claims.get("r"))
    nonce = claims.get("n")
    if not isinstance(nonce, str) or not _spend(nonce, claims["ttl"]):
        raise SignedOut("this sign-in link was already used: ask for a new one")
    return principal


def sign_in(principal: Principal) -> None:
    """Start a session for ``principal`` (a fresh one: no earlier value, CSRF token included)."""
    session.clear()
    session.permanent = True
    session[SESSION_KEY] = {
        "tenant": principal.tenant_id,
        "user": principal.user_id,
        "roles": list(principal.roles),
        "exp": int(time.time()) + current_app.config["KEEL_UI_SESSION_S"],
    }


def sign_out() -> None:
    session.clear()


def current() -> Principal:
    """The signed-in principal, or ``SignedOut`` (no cookie, a forged one, an expired one)."""
    found = session.get(SESSION_KEY)
    if not isinstance(found, dict):
        raise SignedOut()
    expires = found.get("exp")
    if not isinstance(expires, int) or expires <= time.time():
        raise SignedOut("your dashboard session has expired: sign in again")
    return _principal(found.get("tenant"), found.get("user"), found.get("roles"))


def signed_in(role: str | None = None) -> Callable:
    """The view runs for a signed-in principal (with ``role``), its path ids checked like the
    API's; ``g.principal`` is set, as for a token."""

    def wrap(view: Callable) -> Callable:
        @wraps(view)
        def inner(*args: Any, **kwargs: Any) -> Any:
            auth.admit(current(), role)
            check_path_params({name: path_param_schema() for name in kwargs}, kwargs)
            return view(*args, **kwargs)

        inner.required_role = role  # type: ignore[attr-defined]
        return inner

    return wrap
