"""The team's identity provider (OpenID Connect): its keys, its tokens, who they name.

With ``KEEL_OIDC_ISSUER`` set, Keel reads the provider's discovery document
(``/.well-known/openid-configuration``, kept ``DISCOVERY_TTL_S``) and verifies its
tokens against the keys it publishes (``jwks_uri``), as ``web.auth`` does Keel's own
HS256 ones:

- **signature**: RS256 or ES256, by the key the token's ``kid`` names. PyJWT's
  ``PyJWKClient`` keeps the key set ``KEYS_TTL_S`` and fetches it again when a token
  names a ``kid`` it does not hold (at most every ``REFETCH_S``): a rotated key is picked
  up with its first tokens, and a token signed with a key still published (the old one,
  during a rotation) keeps working until it expires;
- **issuer** (``iss``) is the discovery document's, **audience** (``aud``)
  ``KEEL_OIDC_AUDIENCE`` (else the dashboard's client id), and ``exp``, ``iat`` are
  required;
- **who**: the tenant, user and roles come from configurable claims (dotted paths
  for nested ones, ``realm_access.roles``), checked with the same id rules as Keel's
  own tokens.

A provider that cannot be reached while its keys are needed answers 503 (``Unreachable``),
not 401: the token may well be valid. The dashboard's sign-in with the provider is
``web.ui.oidc``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import jwt
import requests

from tasks.platform.config import get_settings
from web.errors import ApiError

DISCOVERY_PATH = "/.well-known/openid-configuration"
ALGORITHMS = ["RS256", "ES256"]
DISCOVERY_TTL_S = 3600.0
KEYS_TTL_S = 300
# An unknown kid fetches the key set again at most this often (a flood of forged kids
# must not become a flood of fetches): a key first used within it waits for it.
REFETCH_S = 5.0
FETCH_TIMEOUT_S = 5.0


class Unreachable(ApiError):
    """The provider's discovery document or keys could not be read."""

    def __init__(self, what: str, exc: BaseException) -> None:
        super().__init__(
            503,
            f"the identity provider's {what} could not be read ({type(exc).__name__})",
            code="identity_provider_unreachable",
            headers={"Retry-After": "5"},
        )


@dataclass(frozen=True)
class Provider:
    """What discovery says of the provider, and its key set."""

    issuer: str
    metadata: dict[str, Any]
    keys: jwt.PyJWKClient

    def endpoint(self, name: str) -> str:
        return endpoint(self.metadata, name)


def endpoint(metadata: dict[str, Any], name: str) -> str:
    """An endpoint the discovery document names (``jwks_uri``, ``token_endpoint``, ...)."""
    url = metadata.get(name)
    if not isinstance(url, str) or not url.startswith(("https://", "http://")):
        raise Unreachable(f"discovery document's {name}", ValueError(f"no {name}"))
    return url


_found: dict[str, tuple[float, Provider]] = {}
_lock = threading.Lock()


def configured() -> bool:
    return bool(get_settings().oidc_issuer)


def provider() -> Provider:
    """The configured provider, discovered at most once per ``DISCOVERY_TTL_S``."""
    issuer = str(get_settings().oidc_issuer).rstrip("/")
    with _lock:
        cached = _found.get(issuer)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        try:
            answer = requests.get(issuer + DISCOVERY_PATH, timeout=FETCH_TIMEOUT_S)
            answer.raise_for_status()
            metadata = answer.json()
        except (requests.RequestException, ValueError) as exc:
            raise Unreachable("discovery document", exc) from None
        if not isinstance(metadata, dict) or str(metadata.get("issuer", "")).rstrip("/") != issuer:
            raise Unreachable("discovery document", ValueError("its issuer is another"))
        jwks_uri = endpoint(metadata, "jwks_uri")
        keys = jwt.PyJWKClient(
            jwks_uri, lifespan=KEYS_TTL_S, timeout=FETCH_TIMEOUT_S, cooldown_duration=REFETCH_S
        )
        made = Provider(str(metadata["issuer"]), metadata, keys)
        _found[issuer] = (time.monotonic() + DISCOVERY_TTL_S, made)
        return made


def verified_claims(token: str, audience: str | None) -> dict[str, Any]:
    """The claims of a token the provider signed for ``audience``; ``jwt.PyJWTError`` if it
    is not one, ``Unreachable`` if the provider's keys cannot be read."""
    found = provider()
    try:
        key = found.keys.get_signing_key_from_jwt(token)
    except jwt.PyJWKClientConnectionError as exc:
        raise Unreachable("keys", exc) from None
    return jwt.decode(
        token,
        key.key,
        algorithms=ALGORITHMS,
        audience=audience,
        issuer=found.issuer,
        options={"require": ["exp", "iat", "iss", "aud"]},
    )


def api_audience() -> str | None:
    settings = get_settings()
    return settings.oidc_audience or settings.oidc_client_id


def claim(claims: dict[str, Any], path: str) -> Any:
    """A claim by its dotted path (``realm_access.roles``); ``None`` if absent."""
    found: Any = claims
    for part in path.split("."):
        if not isinstance(found, dict):
            return None
        found = found.get(part)
    return found


def identity(claims: dict[str, Any]) -> tuple[Any, Any, Any]:
    """``(tenant, user, roles)`` as the configured claims hold them (checked by the caller).
    Roles given as one space-separated string (a scope-like claim) are split."""
    settings = get_settings()
    tenant = settings.oidc_tenant or claim(claims, settings.oidc_tenant_claim)
    roles = claim(claims, settings.oidc_roles_claim)
    if roles is None:
        roles = []
    elif isinstance(roles, str):
        roles = roles.split()
    return tenant, claim(claims, settings.oidc_user_claim), roles
