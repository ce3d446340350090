"""Issuing bearer tokens, and the rules for their ids and signing key (``web.auth`` checks them).

Kept apart from ``web.auth`` so that ``keel token`` imports only PyJWT and these rules,
not Flask, the rate limiter or the job store.
"""

from __future__ import annotations

import re
import time
from typing import TypeGuard

import jwt

ALGORITHMS = ["HS256"]
MAX_TOKEN_BYTES = 8192
MIN_SECRET_BYTES = 32
# Letters, digits, ".", "_", "-"; 1..64 characters; never "." or ".." nor any "..".
# (An empty tenant is the system scope of job schedulers: no token may claim it.)
ID_PATTERN = re.compile(r"(?!.*\.\.)(?!\.$)[A-Za-z0-9._-]{1,64}")
ID_RULE = "1..64 of A-Z a-z 0-9 . _ - without '..' (and not '.')"


def is_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and ID_PATTERN.fullmatch(value) is not None


def check_secret(secret: str | None, name: str = "KEEL_SECRET_KEY") -> str:
    """The signing key, or a ``RuntimeError`` saying why it cannot be used."""
    if not secret:
        raise RuntimeError(f"{name} is not set (keel up sets one for you)")
    if len(secret.encode("utf-8")) < MIN_SECRET_BYTES:
        raise RuntimeError(
            f"{name} holds a key of {len(secret.encode('utf-8'))} bytes; HS256 needs at least "
            f"{MIN_SECRET_BYTES}: use a random one, e.g. secrets.token_urlsafe(48)"
        )
    return secret


def issue_token(secret: str, tenant: str, user: str, roles: list[str], ttl_s: int = 3600) -> str:
    now = int(time.time())
    claims = {"sub": user, "tenant": tenant, "roles": roles, "iat": now, "exp": now + ttl_s}
    return jwt.encode(claims, secret, algorithm="HS256")
