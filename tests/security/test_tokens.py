"""Scenario 7: forged and malformed bearer tokens.

Pass figure: every forged token is answered 401 (with ``WWW-Authenticate`` and
the error shape) on every authenticated endpoint of the served document, and
none gets further. A genuine token on the same requests is not 401, so the
401s are the token's fault and nothing else's.

Each forged token claims the operator role, so a 403 cannot stand in for the
401, and the claim-level forgeries are signed with the *server's own secret*:
only the claim check stands between them and the API.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from functools import lru_cache
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.security.conftest import documented_operations, record_figure
from tests.support.client import token

pytestmark = pytest.mark.usefixtures("stack")

SECRET = os.environ["KEEL_SECRET_KEY"]
OTHER_SECRET = "an-attacker-secret-that-is-long-enough-for-hs256"
PROTECTED = [op for op in documented_operations() if op.authenticated]
REJECTED: list[str] = []
DROP = object()  # a claim to leave out


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**changes: Any) -> dict[str, Any]:
    now = int(time.time())
    # The forgeries are made when the module is collected; the suite may run for a
    # while before they are used, and only the forged part must make them invalid.
    base = {
        "sub": "mallory",
        "tenant": "acme",
        "roles": ["operator"],
        "iat": now,
        "exp": now + 4 * 3600,
    }
    base.update(changes)
    return {k: v for k, v in base.items() if v is not DROP}


def signed(payload: dict[str, Any], secret: str = SECRET, algorithm: str = "HS256") -> str:
    return jwt.encode(payload, secret, algorithm=algorithm)


def hand_signed(header: dict[str, Any], payload: dict[str, Any], key: bytes | None) -> str:
    """A JWT assembled by hand (PyJWT refuses to make some of these, which is the point)."""
    head = b64(json.dumps(header).encode())
    body = b64(json.dumps(payload).encode())
    signature = b"" if key is None else hmac.new(key, f"{head}.{body}".encode(), hashlib.sha256)
    return f"{head}.{body}." + (b64(signature.digest()) if key is not None else "")


@lru_cache(maxsize=1)
def rsa_pair() -> tuple[bytes, bytes]:
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def tampered() -> str:
    """A genuine token whose payload was edited to another tenant, signature kept."""
    head, _, signature = signed(claims()).split(".")
    return f"{head}.{b64(json.dumps(claims(tenant='globex')).encode())}.{signature}"


def forged_tokens() -> dict[str, str]:
    """Made when a test runs, not at collection: a token made minutes earlier could have
    expired (or its ``nbf`` passed) by the time a late test in a long run presents it."""
    private_pem, public_pem = rsa_pair()
    now = int(time.time())
    return {
        "alg none": hand_signed({"alg": "none", "typ": "JWT"}, claims(), None),
        "alg NoNe": hand_signed({"alg": "NoNe", "typ": "JWT"}, claims(), None),
        "RS256 with its own key pair": signed(claims(), private_pem.decode(), "RS256"),
        "HS256 keyed with the RSA public key PEM": hand_signed(
            {"alg": "HS256", "typ": "JWT"}, claims(), public_pem
        ),
        "HS512 with the real secret": signed(claims(), SECRET, "HS512"),
        "bad signature": signed(claims(), OTHER_SECRET),
        "payload edited after signing": tampered(),
        "expired": signed(claims(exp=now - 10)),
        "nbf in the future": signed(claims(nbf=now + 3600)),
        "missing exp": signed(claims(exp=DROP)),
        "missing iat": signed(claims(iat=DROP)),
        "lives ten years": signed(claims(exp=now + 10 * 366 * 86_400)),
        "exp = 2^53": signed(claims(exp=2**53)),
        "iat in the future": signed(claims(iat=now + 3600, exp=now + 7200)),
        "exp not a number": signed(claims(exp="tomorrow")),
        "missing tenant": signed(claims(tenant=DROP)),
        "empty tenant (the system scope)": signed(claims(tenant="")),
        "tenant is a number": signed(claims(tenant=42)),
        "tenant is a list": signed(claims(tenant=["acme"])),
        "tenant over 200 chars": signed(claims(tenant="t" * 201)),
        "tenant with a NUL": signed(claims(tenant="acme\x00")),
        "tenant ../x": signed(claims(tenant="../x")),
        "tenant ..": signed(claims(tenant="..")),
        "tenant .": signed(claims(tenant=".")),
        "tenant with ..": signed(claims(tenant="a..b")),
        "tenant with a slash": signed(claims(tenant="a/b")),
        "tenant with a colon": signed(claims(tenant="X:ops")),
        "tenant over 64 chars": signed(claims(tenant="t" * 65)),
        "sub ../../etc": signed(claims(sub="../../etc")),
        "missing sub": signed(claims(sub=DROP)),
        "sub is a number": signed(claims(sub=7)),
        "roles is a string": signed(claims(roles="operator")),
        "token over 8 KB": signed(claims(padding="x" * 8200)),
        "not a JWT": "not-a-token",
    }


FORGERIES = list(forged_tokens())


def url_of(op) -> str:
    url = op.path
    for param in op.path_params:
        url = url.replace("{" + param + "}", "0123456789abcdef")
    return url


def assert_401(response, what: str) -> None:
    assert response.status_code == 401, f"{what}: {response.status_code} {response.get_data()!r}"
    assert response.headers.get("WWW-Authenticate", "").startswith("Bearer")
    body = response.get_json()
    assert set(body) == {"error", "message", "details"} and body["error"] == "unauthorized"


@pytest.fixture(scope="module", autouse=True)
def figures():
    yield
    record_figure(
        "forged tokens",
        f"{len(REJECTED)} requests rejected 401 ({len(FORGERIES)} forged tokens + 4 carrier "
        f"tricks, x {len(PROTECTED)} authenticated operations), 0 accepted",
    )


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_token_is_401_on_every_authenticated_endpoint(client, forgery):
    # Given a forged token that claims the operator role
    headers = {"Authorization": f"Bearer {forged_tokens()[forgery]}"}
    # When it is presented to every authenticated operation of the document
    for op in PROTECTED:
        response = client.open(url_of(op), method=op.method.upper(), headers=headers)
        # Then each answers 401 before looking at the path or body
        assert_401(response, f"{forgery} on {op.label}")
        REJECTED.append(f"{forgery} {op.label}")


def test_the_8kb_token_is_over_the_limit_and_otherwise_valid():
    # The size check, not the claims, must be what rejects it
    big = forged_tokens()["token over 8 KB"]
    assert len(big) > 8192
    assert jwt.decode(big, SECRET, algorithms=["HS256"])["tenant"] == "acme"


@pytest.mark.parametrize("name", ["access_token", "token"])
@pytest.mark.parametrize("with_header", [False, True], ids=["no header", "with header"])
def test_a_token_in_the_query_string_is_401(client, name, with_header):
    # Given a genuine token passed in the URL (where logs and referrers keep it)
    genuine = token(roles=("operator",))
    headers = {"Authorization": f"Bearer {genuine}"} if with_header else {}
    for op in PROTECTED:
        # When it is used as ?access_token= / ?token=
        response = client.open(
            f"{url_of(op)}?{name}={genuine}", method=op.method.upper(), headers=headers
        )
        # Then 401: tokens are taken from the Authorization header only
        assert_401(response, f"?{name}= on {op.label}")
        REJECTED.append(f"?{name} {op.label}")


def test_a_genuine_token_gets_past_authentication_everywhere(client):
    """The control: the same requests with a genuine operator token are never 401."""
    headers = {"Authorization": f"Bearer {token(roles=('operator',))}"}
    for op in PROTECTED:
        response = client.open(url_of(op), method=op.method.upper(), headers=headers)
        if response.mimetype == "text/event-stream":
            response.close()
        assert response.status_code != 401, f"{op.label}: {response.get_data()!r}"


def test_the_forgeries_cover_the_brief():
    """alg none, key confusion both ways, bad signature, time claims, required and typed
    claims, size, and the query string: each has a token above."""
    expected = {
        "alg none",
        "RS256 with its own key pair",
        "HS256 keyed with the RSA public key PEM",
        "bad signature",
        "expired",
        "nbf in the future",
        "missing exp",
        "missing tenant",
        "tenant is a number",
        "tenant is a list",
        "token over 8 KB",
        "missing iat",
        "lives ten years",
        "tenant ../x",
    }
    assert expected <= set(FORGERIES)
