"""API tokens of the team's identity provider (``web.oidc``), from a real OpenID Connect
provider stand-in on loopback (tests/support/oidc.py): its keys, its rotation, its issuer
and audience; and Keel's own HS256 tokens across a secret-key rotation."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from jwt.utils import base64url_encode

from tasks.platform.config import reload_settings
from tests.support.client import unique
from tests.support.oidc import AUDIENCE, CLIENT_ID, OidcProvider
from tests.support.stack import wait_for
from web import create_app, oidc
from web.tokens import issue_token

JOBS = "/api/v1/jobs"


@pytest.fixture(scope="module")
def provider():
    started = OidcProvider().start()
    yield started
    started.stop()


def configured(monkeypatch, **env: str):
    """An API app made with these KEEL_* settings (the provider found afresh)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reload_settings()
    oidc._found.clear()
    return create_app({"TESTING": True}).test_client()


@pytest.fixture
def api(stack, provider, monkeypatch):
    yield configured(
        monkeypatch,
        KEEL_OIDC_ISSUER=provider.issuer,
        KEEL_OIDC_AUDIENCE=AUDIENCE,
        KEEL_OIDC_CLIENT_ID=CLIENT_ID,
    )
    monkeypatch.undo()
    reload_settings()
    oidc._found.clear()


def status(api, token: str) -> int:
    return api.get(JOBS, headers={"Authorization": f"Bearer {token}"}).status_code


def test_a_providers_token_works_and_names_its_tenant_user_and_roles(api, provider):
    tenant = unique("idp")
    token = provider.token({"sub": "olga", "tenant": tenant, "roles": ["operator"]})
    listed = api.get(JOBS, headers={"Authorization": f"Bearer {token}"})
    assert listed.status_code == 200, listed.get_json()
    # ES256 too
    assert status(api, provider.token({"sub": "bob", "tenant": tenant}, alg="ES256")) == 200


def test_after_a_key_rotation_new_tokens_work_and_old_ones_until_they_expire(api, provider):
    old_key = provider.current()
    old = provider.token(ttl_s=int(oidc.REFETCH_S) + 6)
    assert status(api, old) == 200  # the key set is fetched now
    provider.rotate()
    new = provider.token()
    assert new != old and jwt.get_unverified_header(new)["kid"] != old_key.kid
    # The new kid is fetched again, at most every REFETCH_S: it works within that
    wait_for(lambda: status(api, new) == 200, timeout=oidc.REFETCH_S + 5)
    assert status(api, old) == 200  # the old key is still published
    time.sleep(max(0.0, jwt.decode(old, options={"verify_signature": False})["exp"] - time.time()))
    assert status(api, old) == 401  # until it expires
    assert status(api, new) == 200


def test_a_wrong_audience_or_issuer_or_a_key_it_never_published_is_401(api, provider):
    assert status(api, provider.token(audience="another-api")) == 401
    assert status(api, provider.token(issuer="http://127.0.0.1:9/elsewhere")) == 401
    stranger = OidcProvider()
    stranger.start()  # its own keys, same kid names: signatures do not verify
    try:
        forged = stranger.token(issuer=provider.issuer)
    finally:
        stranger.stop()
    refused = api.get(JOBS, headers={"Authorization": f"Bearer {forged}"})
    assert refused.status_code == 401, refused.get_json()
    assert refused.get_json()["error"] == "unauthorized"


def test_claims_that_name_no_tenant_are_401_unless_one_tenant_is_configured(
    stack, provider, monkeypatch
):
    no_tenant = provider.token({"sub": "alice"})
    api = configured(monkeypatch, KEEL_OIDC_ISSUER=provider.issuer, KEEL_OIDC_AUDIENCE=AUDIENCE)
    refused = api.get(JOBS, headers={"Authorization": f"Bearer {no_tenant}"})
    assert refused.status_code == 401 and "tenant" in refused.get_json()["message"]
    api = configured(monkeypatch, KEEL_OIDC_TENANT="acme", KEEL_OIDC_ROLES_CLAIM="realm.roles")
    assert status(api, no_tenant) == 200
    monkeypatch.undo()
    reload_settings()


def test_the_public_key_used_as_an_hs256_secret_is_refused(api, provider):
    """The algorithm confusion: HS256 "signed" with the provider's public key (which anyone
    can read) is checked as Keel's own token, with Keel's secret, and fails."""
    pem = (
        provider.current()
        .private.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    now = int(time.time())
    header = {"alg": "HS256", "typ": "JWT", "kid": provider.current().kid}
    claims = {"sub": "alice", "tenant": "acme", "iat": now, "exp": now + 60}
    signing_input = b".".join(
        base64url_encode(json.dumps(part).encode()) for part in (header, claims)
    )
    signature = hmac.new(pem, signing_input, hashlib.sha256).digest()
    forged = (signing_input + b"." + base64url_encode(signature)).decode()
    assert status(api, forged) == 401


def test_without_a_provider_its_tokens_are_401_and_an_unreachable_one_is_503(
    stack, provider, monkeypatch
):
    token = provider.token()
    api = configured(monkeypatch, KEEL_OIDC_ISSUER="")
    refused = api.get(JOBS, headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 401 and "KEEL_OIDC_ISSUER" in refused.get_json()["message"]
    api = configured(monkeypatch, KEEL_OIDC_ISSUER="http://127.0.0.1:9", KEEL_OIDC_AUDIENCE="x")
    away = api.get(JOBS, headers={"Authorization": f"Bearer {token}"})
    assert away.status_code == 503, away.get_json()
    assert away.get_json()["error"] == "identity_provider_unreachable"
    monkeypatch.undo()
    reload_settings()
    oidc._found.clear()


def test_keels_own_tokens_signed_with_a_fallback_key_work_until_it_is_dropped(stack, monkeypatch):
    old_secret, new_secret = "an-old-secret-key-of-the-suite-0123456789", "n" * 40
    old = issue_token(old_secret, "acme", "alice", [], 300)
    rotated = configured(
        monkeypatch, KEEL_SECRET_KEY=new_secret, KEEL_SECRET_KEY_FALLBACKS=old_secret
    )
    assert status(rotated, old) == 200
    assert status(rotated, issue_token(new_secret, "acme", "alice", [], 300)) == 200
    dropped = configured(monkeypatch, KEEL_SECRET_KEY_FALLBACKS="")
    assert status(dropped, old) == 401
    monkeypatch.undo()
    reload_settings()
