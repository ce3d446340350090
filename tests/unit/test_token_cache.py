"""A token is verified once per process, but its expiry is checked at every use.

Pure logic: ``web.auth.decode`` against a clock the test moves (the cached
verification must not outlive the token's ``exp``, nor be shared across secrets).
"""

from __future__ import annotations

import time

import jwt
import pytest

from web import auth
from web.errors import ApiError

SECRET = "s" * 32


def signed(**claims: object) -> str:
    now = int(time.time())
    body = {"sub": "alice", "tenant": "acme", "roles": [], "iat": now, "exp": now + 60, **claims}
    return jwt.encode(body, SECRET, algorithm="HS256")


def test_a_token_verified_once_is_refused_once_it_expires(monkeypatch):
    token = signed()
    first = auth.decode(token, SECRET, 3600)
    assert (first.tenant_id, first.user_id) == ("acme", "alice")
    assert auth.decode(token, SECRET, 3600) is first  # the second use is the cached one
    later = time.time() + 61
    monkeypatch.setattr(auth.time, "time", lambda: later)
    with pytest.raises(ApiError) as refused:
        auth.decode(token, SECRET, 3600)
    assert refused.value.status == 401
    assert "expired" in str(refused.value)


def test_a_cached_token_is_not_accepted_under_another_secret_or_a_shorter_lifetime():
    token = signed()
    auth.decode(token, SECRET, 3600)
    with pytest.raises(ApiError) as other_secret:
        auth.decode(token, "t" * 32, 3600)
    assert other_secret.value.status == 401
    with pytest.raises(ApiError) as too_long:
        auth.decode(token, SECRET, 30)
    assert "longer than" in str(too_long.value)


def test_a_refused_token_is_checked_again_every_time(monkeypatch):
    """A token not yet valid (``nbf``) is refused, and accepted once its time has come."""
    now = time.time()
    token = signed(nbf=int(now) + 30)
    with pytest.raises(ApiError):
        auth.decode(token, SECRET, 3600)
    monkeypatch.setattr(jwt.api_jwt, "datetime", _Clock(now + 31))
    assert auth.decode(token, SECRET, 3600).tenant_id == "acme"


class _Clock:
    """Stands in for the ``datetime`` module PyJWT reads its ``now`` from."""

    def __init__(self, at: float) -> None:
        self._at = at

    def now(self, tz=None):
        import datetime as real

        return real.datetime.fromtimestamp(self._at, tz=tz)

    def __getattr__(self, name: str):
        import datetime as real

        return getattr(real.datetime, name)
