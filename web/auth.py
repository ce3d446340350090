"""Bearer tokens: HS256 JWTs whose claims say who is asking.

``sub`` is the user, ``tenant`` the tenant and ``roles`` the roles; ``exp``
is required and only HS256 is accepted. Nothing about the caller's identity
is ever read from a request body.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any

import jwt
from flask import current_app, g, request

from tasks.jobs import Owner
from web import ratelimit
from web.errors import ApiError

ALGORITHMS = ["HS256"]
MAX_TOKEN_BYTES = 8192
# Tenant and user ids are stored in String(200) columns and Postgres text cannot
# hold NUL: an id outside this would fail as a 500 at the first write. (An empty
# tenant is the system scope of job schedulers: no token may claim it.)
MAX_ID_CHARS = 200
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _is_id(value: object) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        return False
    try:
        value.encode("utf-8")  # an unpaired surrogate cannot be stored either
    except UnicodeEncodeError:
        return False
    return not _CONTROL.search(value) and not value.isspace()


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: tenant, user and roles, all from the token."""

    tenant_id: str
    user_id: str
    roles: tuple[str, ...]

    @property
    def owner(self) -> Owner:
        return Owner(self.tenant_id, self.user_id)


def issue_token(secret: str, tenant: str, user: str, roles: list[str], ttl_s: int = 3600) -> str:
    now = int(time.time())
    claims = {"sub": user, "tenant": tenant, "roles": roles, "iat": now, "exp": now + ttl_s}
    return jwt.encode(claims, secret, algorithm="HS256")


def _unauthorized(message: str) -> ApiError:
    return ApiError(401, message, headers={"WWW-Authenticate": 'Bearer realm="keel"'})


def decode(token: str, secret: str) -> Principal:
    if len(token) > MAX_TOKEN_BYTES:
        raise _unauthorized("token too large")
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=ALGORITHMS,
            options={"require": ["exp", "sub", "tenant"]},
        )
    except jwt.PyJWTError as exc:
        raise _unauthorized(f"invalid token: {exc}") from None
    tenant, user, roles = claims.get("tenant"), claims.get("sub"), claims.get("roles", [])
    if not _is_id(tenant) or not _is_id(user):
        raise _unauthorized(
            f"invalid token: tenant and sub must be strings of 1..{MAX_ID_CHARS} printable chars"
        )
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise _unauthorized("invalid token: roles must be a list of strings")
    return Principal(tenant, user, tuple(roles))


def current_principal() -> Principal:
    header = request.headers.get("Authorization", "")
    if "access_token" in request.args or "token" in request.args:
        raise _unauthorized("tokens are accepted only in the Authorization header")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("missing bearer token")
    return decode(token.strip(), current_app.config["SECRET_KEY"])


def require(role: str | None = None) -> Callable:
    """Authenticate the caller (and check ``role``) before the view runs."""

    def wrap(view: Callable) -> Callable:
        @wraps(view)
        def inner(*args: Any, **kwargs: Any) -> Any:
            principal = current_principal()
            ratelimit.check(principal.tenant_id)  # after authentication: the key is the tenant
            if role is not None and role not in principal.roles:
                raise ApiError(403, f"role {role!r} required")
            g.principal = principal
            return view(*args, **kwargs)

        inner.required_role = role  # type: ignore[attr-defined]
        return inner

    return wrap
