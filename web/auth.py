"""Bearer tokens: HS256 JWTs whose claims say who is asking.

``sub`` is the user, ``tenant`` the tenant and ``roles`` the roles; ``iat``
and ``exp`` are required, and a token may live at most ``KEEL_TOKEN_MAX_TTL_S``
(30 days by default) — a stolen token stops working. Only HS256 is accepted,
with a key of at least 32 bytes. Nothing about the caller's identity is ever
read from a request body.

Tenant and user ids are plain names (``web.tokens.ID_PATTERN``): they appear in object
keys and derived ids, so ``/``, ``..`` and other separators are refused with
the token, before any of them could reach a path or a key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import Any

import jwt
from flask import current_app, g, request

from tasks.jobs import Owner
from web import access, ratelimit
from web.errors import ApiError
from web.tokens import ALGORITHMS, ID_RULE, MAX_TOKEN_BYTES, is_id

OPERATOR = "operator"


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: tenant, user and roles, all from the token."""

    tenant_id: str
    user_id: str
    roles: tuple[str, ...]

    @property
    def owner(self) -> Owner:
        return Owner(self.tenant_id, self.user_id)

    @property
    def operator(self) -> bool:
        """Operators act on every object of their tenant; other users on their own."""
        return OPERATOR in self.roles


def _lifetime_problem(claims: dict[str, Any], max_ttl_s: int) -> str | None:
    issued, expires = claims.get("iat"), claims.get("exp")
    if not isinstance(issued, int | float) or not isinstance(expires, int | float):
        return "iat and exp must be numbers"
    if expires - issued > max_ttl_s:
        return f"the token lives longer than the {max_ttl_s} s allowed"
    return None


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": 'Bearer realm="keel"'})


def decode(token: str, secret: str, max_ttl_s: int) -> Principal:
    if len(token) > MAX_TOKEN_BYTES:
        raise _unauthorized("token too large")
    principal, expires = _verified(token, secret, max_ttl_s)
    if expires <= time.time():  # PyJWT's own test of ``exp`` (no leeway)
        raise _unauthorized("invalid token: Signature has expired")
    return principal


@lru_cache(maxsize=4096)
def _verified(token: str, secret: str, max_ttl_s: int) -> tuple[Principal, float]:
    """Everything about a token that cannot change once it passed: its signature, required
    and typed claims, lifetime, and the time claims that only pass more surely as time goes
    on (``iat``, ``nbf``). Checked once per token and process (a client sends the same token
    with every request; verifying it was a tenth of a report submission's CPU); ``exp`` is
    checked at every use (``decode``). A token that fails is never kept."""
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=ALGORITHMS,
            options={"require": ["exp", "iat", "sub", "tenant"]},
        )
    except jwt.PyJWTError as exc:
        raise _unauthorized(f"invalid token: {exc}") from None
    lifetime = _lifetime_problem(claims, max_ttl_s)
    if lifetime:
        raise _unauthorized(f"invalid token: {lifetime}")
    tenant, user, roles = claims.get("tenant"), claims.get("sub"), claims.get("roles", [])
    if not is_id(tenant) or not is_id(user):
        raise _unauthorized(f"invalid token: tenant and sub must be ids ({ID_RULE})")
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise _unauthorized("invalid token: roles must be a list of strings")
    return Principal(tenant, user, tuple(roles)), float(claims["exp"])


def current_principal() -> Principal:
    header = request.headers.get("Authorization", "")
    if "access_token" in request.args or "token" in request.args:
        raise _unauthorized("tokens are accepted only in the Authorization header")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing bearer token")
    config = current_app.config
    return decode(token.strip(), config["SECRET_KEY"], config["KEEL_TOKEN_MAX_TTL_S"])


def admit(principal: Principal, role: str | None = None) -> Principal:
    """What every authenticated request passes, from a token or a dashboard session.

    The rate limit is keyed by the verified identity; the role is checked
    before any object is looked up, so a 403 says nothing about existence.
    """
    access.note_tenant(principal.tenant_id)  # this request's log lines name the tenant
    ratelimit.check(principal.tenant_id, principal.user_id)
    if role is not None and role not in principal.roles:
        raise ApiError(403, f"role {role!r} required")
    g.principal = principal
    return principal


SYSTEM_WIDE = (
    "a system-wide view: read with the metrics token (KEEL_METRICS_TOKEN) or the keel command,"
    " not a tenant's token"
)


def require(
    role: str | None = None, admits: Callable[[], bool] | None = None, tenants: bool = True
) -> Callable:
    """Authenticate the caller (and check ``role``) before the view runs, unless ``admits``
    lets the caller in on other grounds. ``tenants=False``: only ``admits`` does; a tenant's
    token, whatever its roles, is authenticated (401 if invalid) and refused (403)."""

    def wrap(view: Callable) -> Callable:
        @wraps(view)
        def inner(*args: Any, **kwargs: Any) -> Any:
            if admits is None or not admits():
                admit(current_principal(), role)
                if not tenants:
                    raise ApiError(403, SYSTEM_WIDE)
            return view(*args, **kwargs)

        inner.required_role = role  # type: ignore[attr-defined]
        return inner

    return wrap
