"""Bearer tokens: JWTs whose claims say who is asking.

Keel's own (``keel token``) are HS256, signed with ``KEEL_SECRET_KEY`` (at least 32
bytes) or, while a rotation lasts, one of ``KEEL_SECRET_KEY_FALLBACKS``: ``sub`` is the
user, ``tenant`` the tenant and ``roles`` the roles. With ``KEEL_OIDC_ISSUER`` set,
RS256 and ES256 tokens of the team's identity provider are accepted too, verified
against its published keys, issuer and audience, their identity read from the
configured claims (``web.oidc``). Either way ``iat`` and ``exp`` are required, and a
token may live at most ``KEEL_TOKEN_MAX_TTL_S`` (30 days by default) — a stolen token
stops working. Nothing about the caller's identity is ever read from a request body.

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
from web import access, oidc, ratelimit
from web.errors import ApiError
from web.tokens import ALGORITHMS, ID_RULE, MAX_TOKEN_BYTES, is_id

OPERATOR = "operator"
# The dashboard's role of the people who run Keel (``keel ui-link --platform``): it reads every
# tenant's pages. Only a platform session holds it (``Principal.platform``); a token's or an
# identity provider's "platform" in ``roles`` is a name like any other and grants nothing.
PLATFORM = "platform"
EVERY_TENANT = "*"  # a platform session's tenant: not an id (``is_id``), so no tenant's


@dataclass(frozen=True)
class Principal:
    """The authenticated caller: tenant, user and roles, all from the token."""

    tenant_id: str
    user_id: str
    roles: tuple[str, ...]
    # Set only by a sign-in link of ``keel ui-link --platform`` (``web.ui.session``), never
    # from a token's claims.
    platform: bool = False

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


def decode(token: str, secret: str, max_ttl_s: int, fallbacks: tuple[str, ...] = ()) -> Principal:
    """The principal of a bearer token: Keel's own (HS256, ``secret`` or a ``fallbacks``
    key) or the identity provider's (``web.oidc``); 401 otherwise."""
    if len(token) > MAX_TOKEN_BYTES:
        raise _unauthorized("token too large")
    if _algorithm(token) in oidc.ALGORITHMS:
        principal, expires = _from_provider(token, max_ttl_s)
    else:
        principal, expires = _verified(token, (secret, *fallbacks), max_ttl_s)
    if expires <= time.time():  # PyJWT's own test of ``exp`` (no leeway)
        raise _unauthorized("invalid token: Signature has expired")
    return principal


def _algorithm(token: str) -> object:
    try:
        return jwt.get_unverified_header(token).get("alg")
    except jwt.PyJWTError as exc:
        raise _unauthorized(f"invalid token: {exc}") from None


def _from_provider(token: str, max_ttl_s: int) -> tuple[Principal, float]:
    """A token of the identity provider (RS256, ES256): verified at every use, against the
    keys it publishes now (a key it withdrew stops its tokens at once)."""
    if not oidc.configured():
        raise _unauthorized(
            "invalid token: RS256 and ES256 tokens are an identity provider's, and none is "
            "configured (KEEL_OIDC_ISSUER)"
        )
    try:
        claims = oidc.verified_claims(token, oidc.api_audience())
    except jwt.PyJWTError as exc:
        raise _unauthorized(f"invalid token: {exc}") from None
    return _of_provider(claims, max_ttl_s)


def provider_principal(claims: dict[str, Any], max_ttl_s: int) -> Principal:
    """Who a verified token of the identity provider names (an ID token, at the dashboard's
    sign-in); 401 if its claims do not name a tenant and a user by Keel's id rules."""
    return _of_provider(claims, max_ttl_s)[0]


def _of_provider(claims: dict[str, Any], max_ttl_s: int) -> tuple[Principal, float]:
    tenant, user, roles = oidc.identity(claims)
    return _principal_of(claims, tenant, user, roles, max_ttl_s, "the tenant and user claims")


@lru_cache(maxsize=4096)
def _verified(token: str, keys: tuple[str, ...], max_ttl_s: int) -> tuple[Principal, float]:
    """Everything about a token of Keel's that cannot change once it passed: its signature
    (by the first of ``keys``, or an earlier one still accepted), required and typed
    claims, lifetime, and the time claims that only pass more surely as time goes on
    (``iat``, ``nbf``). Checked once per token and process (a client sends the same token
    with every request; verifying it was a tenth of a report submission's CPU); ``exp`` is
    checked at every use (``decode``). A token that fails is never kept."""
    try:
        claims = _signed_by_one_of(token, keys)
    except jwt.PyJWTError as exc:
        raise _unauthorized(f"invalid token: {exc}") from None
    return _principal_of(
        claims, claims.get("tenant"), claims.get("sub"), claims.get("roles", []), max_ttl_s
    )


def _signed_by_one_of(token: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The claims, checked with the first key that the signature matches."""
    *earlier, last = keys
    for key in earlier:
        try:
            return _claims(token, key)
        except jwt.InvalidSignatureError:
            continue
    return _claims(token, last)


def _claims(token: str, key: str) -> dict[str, Any]:
    return jwt.decode(
        token, key, algorithms=ALGORITHMS, options={"require": ["exp", "iat", "sub", "tenant"]}
    )


def _principal_of(
    claims: dict[str, Any],
    tenant: Any,
    user: Any,
    roles: Any,
    max_ttl_s: int,
    named: str = "tenant and sub",
) -> tuple[Principal, float]:
    """The principal a verified token names, once its lifetime and ids pass; its expiry."""
    lifetime = _lifetime_problem(claims, max_ttl_s)
    if lifetime:
        raise _unauthorized(f"invalid token: {lifetime}")
    if not is_id(tenant) or not is_id(user):
        raise _unauthorized(f"invalid token: {named} must be ids ({ID_RULE})")
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
    return decode(
        token.strip(),
        config["SECRET_KEY"],
        config["KEEL_TOKEN_MAX_TTL_S"],
        tuple(config.get("SECRET_KEY_FALLBACKS") or ()),
    )


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
