"""Signing in to the dashboard: one-time links, and the session cookie they set.

A browser cannot send a bearer token, so ``keel ui-link`` prints a URL whose
last segment is a link token: tenant, user, roles, a random nonce and a
lifetime, signed with ``KEEL_SECRET_KEY`` under a salt of its own (no other
signature of Keel's verifies as one). The first time the link is opened, its
nonce is marked used in Redis (``SET NX``, kept as long as the link could
still be valid), so a second use — a forwarded link, a browser history
entry, a proxy log — is refused. While Redis does not answer, links are
refused too: a link that could be used twice is not one-time.

The session is a random id in Flask's signed cookie (``HttpOnly``,
``SameSite=Strict``, ``Secure`` over HTTPS, see ``web.ui.init_app``) with its
expiry; the identity lives in Redis under that id (``keel:ui-session:<id>``),
so a session ends on the server and not only in one browser: sign-out deletes
it (every copy of the cookie, CSRF token included, is then signed out),
``sign_out_everywhere`` deletes all of a user's, a session nobody used for
``KEEL_UI_IDLE_S`` lapses (its key's TTL, renewed by a page or a form, not by
a page's own refreshes), none outlives ``KEEL_UI_SESSION_S``, and one started
under another ``KEEL_SECRET_KEY`` is refused. While Redis does not answer,
pages answer 503 rather than trust a cookie that may have been signed out.
Each request turns the record back into a ``web.auth.Principal`` and passes
``web.auth.admit`` — the API's rate limit and role check — and the pages then
call the API's own owner-scoped operations (``web.jobs.read_job`` and its
siblings), so what a session may see and do is decided by the same code as
for a token. A link of ``issue_platform_link`` (``keel ui-link --platform``) carries a mark
of its own, kept in the session's record: only that makes a platform session
(``web.ui.platform``), never a role's name.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable, Sequence
from functools import wraps
from typing import Any

from flask import current_app, g, request, session
from itsdangerous import BadSignature, SignatureExpired, URLSafeTimedSerializer

from web import auth
from web.api import check_path_params, path_param_schema
from web.auth import EVERY_TENANT, PLATFORM, Principal
from web.errors import ApiError
from web.ui import platform
from web.ui.platform import PLATFORM_ONLY, Reach

LINK_SALT = "keel.ui-link"
DEFAULT_LINK_TTL_S = 300
MAX_LINK_TTL_S = 3600
NONCE_KEY = "keel:ui-link:{nonce}"
SESSION_KEY = "keel"
MAX_LINK_BYTES = 2048
SESSION_RECORD_KEY = "keel:ui-session:{sid}"
USER_SESSIONS_KEY = "keel:ui-sessions:{tenant}:{user}"
CACHE = "keel_ui_principal"
USED = "this sign-in link was already used: ask for a new one"
ENDED = "your dashboard session has ended (signed out, or unused for too long): sign in again"


class SignedOut(ApiError):
    """No valid dashboard session: sign in with a link from ``keel ui-link``."""

    DEFAULT = "sign in with a link from `keel ui-link`"
    CODE = "signed_out"

    def __init__(self, message: str = DEFAULT) -> None:
        super().__init__(401, message, code=self.CODE)


def _serializer(secret: str, fallbacks: Sequence[str] = ()) -> URLSafeTimedSerializer:
    """Signs with ``secret``; reads what it or one of ``fallbacks`` signed."""
    return URLSafeTimedSerializer([*fallbacks, secret], salt=LINK_SALT)


def issue_link(
    secret: str, tenant: str, user: str, roles: list[str], ttl_s: int = DEFAULT_LINK_TTL_S
) -> str:
    """A link token for ``/ui/login/<token>``, valid once, for ``ttl_s`` seconds."""
    return _issue(secret, {"t": tenant, "u": user, "r": roles}, ttl_s)


def issue_platform_link(secret: str, user: str, ttl_s: int = DEFAULT_LINK_TTL_S) -> str:
    """A link token whose session has the platform role (every tenant's pages, read only,
    audited: ``web.ui.platform``). Only who holds ``KEEL_SECRET_KEY`` makes one (``keel
    ui-link --platform``); no token and no identity provider's sign-in leads to one."""
    return _issue(secret, {"t": EVERY_TENANT, "u": user, "r": [PLATFORM], "p": True}, ttl_s)


def _issue(secret: str, who: dict[str, Any], ttl_s: int) -> str:
    if not 1 <= ttl_s <= MAX_LINK_TTL_S:
        raise ValueError(f"a sign-in link lives 1..{MAX_LINK_TTL_S} s")
    claims = {**who, "n": secrets.token_urlsafe(18), "ttl": ttl_s}
    return _serializer(secret).dumps(claims)


def _claims(token: str) -> dict[str, Any]:
    if len(token) > MAX_LINK_BYTES:
        raise SignedOut("this sign-in link is not valid")
    config = current_app.config
    serializer = _serializer(config["SECRET_KEY"], config.get("SECRET_KEY_FALLBACKS") or ())
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


def _principal(tenant: Any, user: Any, roles: Any, platform: Any = False) -> Principal:
    """Who a link or a session record names; ``platform`` only if it says so itself (its
    ``p``/``platform`` field, which only ``issue_platform_link`` writes), never from
    ``roles``."""
    if platform is True:
        if not auth.is_id(user):
            raise SignedOut()
        return Principal(EVERY_TENANT, user, (PLATFORM,), platform=True)
    if not auth.is_id(tenant) or not auth.is_id(user):
        raise SignedOut()
    if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
        raise SignedOut()
    return Principal(tenant, user, tuple(roles))


def _spend(nonce: str, ttl_s: int) -> bool:
    """Mark the link's nonce used; False if it already was."""
    key = NONCE_KEY.format(nonce=nonce)
    return bool(_redis(lambda r: r.set(key, 1, nx=True, ex=ttl_s + 60), "sign-in"))


def _link(token: str) -> tuple[Principal, dict[str, Any]]:
    claims = _claims(token)
    principal = _principal(claims.get("t"), claims.get("u"), claims.get("r"), claims.get("p"))
    if not isinstance(claims.get("n"), str):
        raise SignedOut("this sign-in link is not valid")
    return principal, claims


def read_link(token: str) -> Principal:
    """The identity a link token carries, without spending it (``SignedOut`` if it cannot be
    used: not valid, expired or already used)."""
    principal, claims = _link(token)
    used = _redis(lambda r: r.exists(NONCE_KEY.format(nonce=claims["n"])), "sign-in")
    if used:
        raise SignedOut(USED)
    return principal


def redeem_link(token: str) -> Principal:
    """The identity a link token carries, spending it (``SignedOut`` if it cannot be used)."""
    principal, claims = _link(token)
    if not _spend(claims["n"], claims["ttl"]):
        raise SignedOut(USED)
    return principal


def _redis(call: Callable[[Any], Any], what: str = "the dashboard") -> Any:
    """``call(redis)``; 503 while Redis does not answer (sessions are checked there: a session
    that could outlive its sign-out is not ended)."""
    from tasks.platform import broker

    refused = ApiError(
        503, f"{what} is unavailable while Redis does not answer", headers={"Retry-After": "2"}
    )
    if broker.unreachable():
        raise refused
    started = time.monotonic()
    try:
        return call(broker.redis_client())
    except broker.UNREACHABLE_ERRORS as exc:
        broker.failed(exc, started)
        raise refused from None


def _key_id(secret: str | None = None) -> str:
    """Which secret key a session was started under (``KEEL_SECRET_KEY``'s, by default)."""
    key = str(secret or current_app.config["SECRET_KEY"]).encode("utf-8")
    return hmac.new(key, b"keel.ui-session", hashlib.sha256).hexdigest()[:32]


def _accepted_key_ids() -> set[str]:
    """The key ids whose sessions live on: ``KEEL_SECRET_KEY``'s and its fallbacks' (a
    rotation signs nobody out; dropping a fallback ends the sessions it started)."""
    fallbacks = current_app.config.get("SECRET_KEY_FALLBACKS") or ()
    return {_key_id(), *(_key_id(key) for key in fallbacks)}


def _idle_s() -> int:
    return int(current_app.config["KEEL_UI_IDLE_S"])


def sign_in(principal: Principal) -> None:
    """Start a session for ``principal`` (a fresh one: no earlier value, CSRF token included).

    The cookie holds a random session id and the expiry; the identity is in Redis under
    that id, kept while the session is used (idle timeout) and never past its expiry."""
    lifetime = int(current_app.config["KEEL_UI_SESSION_S"])
    sid = secrets.token_urlsafe(24)
    expires = int(time.time()) + lifetime
    record = {
        "tenant": principal.tenant_id,
        "user": principal.user_id,
        "roles": list(principal.roles),
        "platform": principal.platform,
        "exp": expires,
        "key": _key_id(),
    }
    index = USER_SESSIONS_KEY.format(tenant=principal.tenant_id, user=principal.user_id)

    def store(redis: Any) -> None:
        pipe = redis.pipeline(transaction=True)
        pipe.set(
            SESSION_RECORD_KEY.format(sid=sid), json.dumps(record), ex=min(lifetime, _idle_s())
        )
        pipe.sadd(index, sid)
        pipe.expire(index, lifetime + 60)
        pipe.execute()

    _redis(store, "sign-in")
    session.clear()
    session.permanent = True
    session[SESSION_KEY] = {"sid": sid, "exp": expires}
    g.pop(CACHE, None)


def sign_out() -> None:
    """End this browser's session: at once, for every copy of its cookie."""
    found = session.get(SESSION_KEY)
    sid = found.get("sid") if isinstance(found, dict) else None
    if isinstance(sid, str):
        _redis(lambda r: r.delete(SESSION_RECORD_KEY.format(sid=sid)))
    session.clear()
    g.pop(CACHE, None)


def sign_out_everywhere(tenant: str, user: str) -> int:
    """End every dashboard session of ``user`` of ``tenant`` (every browser); how many were
    live. For an operator or a script: ``from web.ui.session import sign_out_everywhere``
    inside the app's context."""
    index = USER_SESSIONS_KEY.format(tenant=tenant, user=user)

    def end(redis: Any) -> int:
        sids = [s.decode() if isinstance(s, bytes) else s for s in redis.smembers(index)]
        if not sids:
            return 0
        pipe = redis.pipeline(transaction=True)
        pipe.delete(*(SESSION_RECORD_KEY.format(sid=s) for s in sids))
        pipe.delete(index)
        return int(pipe.execute()[0])

    ended = int(_redis(end))
    g.pop(CACHE, None)
    return ended


def _in_use() -> bool:
    """A person's own step (a page opened, a form sent), not a page's script refreshing
    itself: only those keep a session from idling out."""
    return request.headers.get("Sec-Fetch-Mode", "navigate") == "navigate"


def current() -> Principal:
    """The signed-in principal, or ``SignedOut`` (no cookie, a forged one, an expired one,
    one signed out, idle too long or started under another secret key)."""
    if CACHE in g:
        return g.get(CACHE)
    found = session.get(SESSION_KEY)
    if not isinstance(found, dict):
        raise SignedOut()
    expires = found.get("exp")
    if not isinstance(expires, int) or expires <= time.time():
        raise SignedOut("your dashboard session has expired: sign in again")
    sid = found.get("sid")
    if not isinstance(sid, str) or len(sid) > 64:
        raise SignedOut()
    key = SESSION_RECORD_KEY.format(sid=sid)
    keep_s = max(1, min(_idle_s(), expires - int(time.time())))
    touch = _in_use()

    def load(redis: Any) -> Any:
        if not touch:
            return redis.get(key)
        pipe = redis.pipeline(transaction=True)
        pipe.get(key)
        pipe.expire(key, keep_s)  # nothing if it is gone: a sign-out is never undone
        return pipe.execute()[0]

    raw = _redis(load)
    try:
        record = json.loads(raw) if raw is not None else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or record.get("key") not in _accepted_key_ids():
        raise SignedOut(ENDED)
    if record.get("exp") != expires:
        raise SignedOut(ENDED)
    principal = _principal(
        record.get("tenant"), record.get("user"), record.get("roles"), record.get("platform")
    )
    g.setdefault(CACHE, principal)
    return principal


def current_or_none() -> Principal | None:
    try:
        return current()
    except SignedOut:
        return None


def signed_in(role: str | None = None, *, reach: Reach = "refused") -> Callable:
    """The view runs for a signed-in principal (with ``role``), its path ids checked like the
    API's; ``g.principal`` is set, as for a token. ``reach`` says what a platform session
    may do here (``web.ui.platform``): ``refused`` (403: a tenant's page or an action),
    ``reads`` (the view shows every tenant's records to it, audited), ``only`` (a page of
    the platform role alone; a tenant's session is 403) or ``acts`` (a form of the platform
    role alone, that changes a system-wide setting)."""

    def wrap(view: Callable) -> Callable:
        @wraps(view)
        def inner(*args: Any, **kwargs: Any) -> Any:
            principal = current()
            if principal.platform or reach in PLATFORM_ONLY:
                platform.admit(principal, reach)
            else:
                auth.admit(principal, role)
            check_path_params({name: path_param_schema() for name in kwargs}, kwargs)
            if principal.platform:
                platform.audit(principal)
            return view(*args, **kwargs)

        inner.required_role = role  # type: ignore[attr-defined]
        inner.reach = reach  # type: ignore[attr-defined]
        return inner

    return wrap
