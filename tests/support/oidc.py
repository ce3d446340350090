"""A small OpenID Connect provider for the tests: its own keys, discovery document, key set,
authorization endpoint (which signs in whoever it is told to, at once) and token endpoint
(authorization code with PKCE, S256 only).

Served by werkzeug in a thread of the test process, on loopback (``ServedApp``). It issues
RS256 tokens with its current key (``rotate`` makes a new one current and keeps publishing
the old one, as providers do during a rotation) and ES256 tokens with a key of its own.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from flask import Flask, abort, jsonify, redirect, request

from keel.embedded import free_port
from tests.support.browser import ServedApp

CLIENT_ID = "keel-dashboard"
CLIENT_SECRET = "a-client-secret-of-the-tests"
AUDIENCE = "keel-api"


@dataclass
class _Key:
    kid: str
    alg: str
    private: Any

    def public_jwk(self) -> dict[str, Any]:
        if self.alg == "RS256":
            jwk = jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        else:
            jwk = jwt.algorithms.ECAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return {**jwk, "kid": self.kid, "alg": self.alg, "use": "sig"}


@dataclass
class OidcProvider:
    port: int = field(default_factory=free_port)
    # Who the authorization endpoint signs in next (claims of the ID token).
    user: dict[str, Any] = field(default_factory=lambda: {"sub": "alice", "tenant": "acme"})
    keys: list[_Key] = field(default_factory=list)
    codes: dict[str, dict[str, Any]] = field(default_factory=dict)
    key_set_fetches: int = 0
    served: ServedApp | None = None

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OidcProvider:
        self.keys = [
            _Key("rsa-1", "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048)),
            _Key("ec-1", "ES256", ec.generate_private_key(ec.SECP256R1())),
        ]
        self.served = ServedApp(self._app(), port=self.port).start()
        return self

    def stop(self) -> None:
        if self.served is not None:
            self.served.stop()

    def rotate(self) -> str:
        """A new RSA key signs from now on; the old ones stay published. The new kid."""
        kid = f"rsa-{sum(1 for k in self.keys if k.alg == 'RS256') + 1}"
        self.keys.append(
            _Key(kid, "RS256", rsa.generate_private_key(public_exponent=65537, key_size=2048))
        )
        return kid

    def current(self, alg: str = "RS256") -> _Key:
        return [key for key in self.keys if key.alg == alg][-1]

    def token(
        self,
        claims: dict[str, Any] | None = None,
        *,
        audience: str = AUDIENCE,
        issuer: str | None = None,
        ttl_s: int = 300,
        alg: str = "RS256",
        key: _Key | None = None,
    ) -> str:
        """An access token for the API, as the provider would issue it."""
        now = int(time.time())
        body = {
            "iss": issuer or self.issuer,
            "aud": audience,
            "iat": now,
            "exp": now + ttl_s,
            **(claims if claims is not None else self.user),
        }
        signer = key or self.current(alg)
        return jwt.encode(body, signer.private, algorithm=signer.alg, headers={"kid": signer.kid})

    def _app(self) -> Flask:
        app = Flask("oidc-provider")

        @app.get("/.well-known/openid-configuration")
        def discovery() -> Any:
            return jsonify(
                issuer=self.issuer,
                authorization_endpoint=f"{self.issuer}/authorize",
                token_endpoint=f"{self.issuer}/token",
                jwks_uri=f"{self.issuer}/jwks",
                response_types_supported=["code"],
                subject_types_supported=["public"],
                id_token_signing_alg_values_supported=["RS256", "ES256"],
                code_challenge_methods_supported=["S256"],
                token_endpoint_auth_methods_supported=["client_secret_basic"],
            )

        @app.get("/jwks")
        def jwks() -> Any:
            self.key_set_fetches += 1
            return jsonify(keys=[key.public_jwk() for key in self.keys])

        @app.get("/authorize")
        def authorize() -> Any:
            asked = request.args
            if asked.get("client_id") != CLIENT_ID or asked.get("response_type") != "code":
                abort(400)
            if asked.get("code_challenge_method") != "S256" or not asked.get("code_challenge"):
                abort(400)
            code = secrets.token_urlsafe(16)
            self.codes[code] = {
                "redirect_uri": asked["redirect_uri"],
                "challenge": asked["code_challenge"],
                "nonce": asked.get("nonce"),
                "user": dict(self.user),
            }
            back = urlencode({"code": code, "state": asked.get("state", "")})
            return redirect(f"{asked['redirect_uri']}?{back}", 302)

        @app.post("/token")
        def token() -> Any:
            auth = request.authorization
            if auth is None or (auth.username, auth.password) != (CLIENT_ID, CLIENT_SECRET):
                return jsonify(error="invalid_client"), 401
            form = request.form
            grant = self.codes.pop(form.get("code", ""), None)
            if grant is None or form.get("grant_type") != "authorization_code":
                return jsonify(error="invalid_grant"), 400
            verifier = form.get("code_verifier", "").encode()
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=")
            if challenge.decode() != grant["challenge"]:
                return jsonify(error="invalid_grant", error_description="PKCE"), 400
            if form.get("redirect_uri") != grant["redirect_uri"]:
                return jsonify(error="invalid_grant", error_description="redirect_uri"), 400
            claims = {**grant["user"], "nonce": grant["nonce"]}
            return jsonify(
                token_type="Bearer",
                expires_in=300,
                access_token=self.token(grant["user"]),
                id_token=self.token(claims, audience=CLIENT_ID),
            )

        return app
