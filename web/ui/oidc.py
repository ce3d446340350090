"""Signing in to the dashboard with the team's identity provider (OpenID Connect).

With ``KEEL_OIDC_ISSUER`` and ``KEEL_OIDC_CLIENT_ID`` set, the sign-in page offers the
provider beside ``keel ui-link``. The flow is the authorization code with PKCE (S256)
and a nonce, Authlib's client doing the protocol:

1. ``GET /ui/oidc/login`` makes a state, a nonce and a code verifier, keeps them in a
   signed cookie of their own (``FLOW_COOKIE``: ten minutes, this path only, and
   ``SameSite=Lax``: the provider sends the browser back with a cross-site navigation,
   which carries no ``SameSite=Strict`` cookie, the session's kind), and sends the
   browser to the provider;
2. ``GET /ui/oidc/callback`` takes the code only with the state of this browser's own
   cookie (another site cannot finish a sign-in it did not start here), exchanges it
   with the verifier, verifies the ID token (``web.oidc``: the provider's keys,
   issuer, audience = the client id, and the nonce), reads who it names from the
   configured claims, and starts a dashboard session as a link does.

The redirect URI is ``KEEL_PUBLIC_URL`` + ``/ui/oidc/callback`` (built from
configuration, never from the request's Host: ``web.hosts``).
"""

from __future__ import annotations

import hmac
import secrets
from typing import Any

import jwt
from authlib.integrations.base_client.errors import OAuthError
from authlib.integrations.requests_client import OAuth2Session
from flask import current_app, g, redirect, render_template, request, url_for
from itsdangerous import BadSignature, URLSafeTimedSerializer
from werkzeug.exceptions import NotFound

from tasks.platform.config import get_settings
from web import auth, hosts, oidc
from web.errors import ApiError
from web.ui import bp
from web.ui.session import current_or_none, sign_in, sign_out

FLOW_COOKIE = "keel_oidc"
FLOW_TTL_S = 600
FLOW_SALT = "keel.oidc-flow"
SCOPE = "openid profile"


def enabled() -> bool:
    settings = get_settings()
    return bool(settings.oidc_issuer and settings.oidc_client_id)


def _client() -> OAuth2Session:
    settings = get_settings()
    base = hosts.public_base()
    if base is None:
        raise ApiError(
            500,
            "the provider's sign-in needs KEEL_PUBLIC_URL (where people reach Keel)",
            code="not_configured",
        )
    return OAuth2Session(
        settings.oidc_client_id,
        settings.oidc_client_secret,
        scope=SCOPE,
        redirect_uri=f"{base}/ui/oidc/callback",
        code_challenge_method="S256",
        token_endpoint_auth_method="client_secret_basic" if settings.oidc_client_secret else "none",
    )


def _flows() -> URLSafeTimedSerializer:
    config = current_app.config
    keys = [*(config.get("SECRET_KEY_FALLBACKS") or ()), config["SECRET_KEY"]]
    return URLSafeTimedSerializer(keys, salt=FLOW_SALT)


@bp.get("/oidc/login")
def oidc_login() -> Any:
    """Start a sign-in with the provider: to its authorization endpoint (303)."""
    if not enabled():
        raise NotFound()
    flow = {
        "state": secrets.token_urlsafe(24),
        "nonce": secrets.token_urlsafe(24),
        "verifier": secrets.token_urlsafe(48),
    }
    found = oidc.provider()
    with _client() as client:
        url, _state = client.create_authorization_url(
            found.endpoint("authorization_endpoint"),
            state=flow["state"],
            code_verifier=flow["verifier"],
            nonce=flow["nonce"],
        )
    response = redirect(url, 303)
    response.set_cookie(
        FLOW_COOKIE,
        _flows().dumps(flow),
        max_age=FLOW_TTL_S,
        path="/ui/oidc/",
        secure=request.is_secure or bool(current_app.config.get("SESSION_COOKIE_SECURE")),
        httponly=True,
        samesite="Lax",
    )
    return response


@bp.get("/oidc/callback")
def oidc_callback() -> Any:
    """The provider sent the browser back: finish the sign-in, then the jobs page."""
    if not enabled():
        raise NotFound()
    response: Any
    try:
        principal = _finish()
    except _Refused as refused:
        g.principal = current_or_none()
        page = render_template("ui/signin.html", status=401, message=str(refused))
        response = current_app.make_response((page, 401))
    else:
        sign_out()  # a session this browser had ends on the server
        sign_in(principal)
        response = redirect(url_for("ui.jobs"), 303)
    response.delete_cookie(FLOW_COOKIE, path="/ui/oidc/")
    return response


class _Refused(Exception):
    """The sign-in cannot finish; the message says why, for the person."""


def _finish() -> auth.Principal:
    if "error" in request.args:
        said = request.args.get("error_description") or request.args["error"]
        raise _Refused(f"the identity provider did not sign you in: {said[:200]}")
    flow = _flow()
    if not hmac.compare_digest(str(request.args.get("state", "")), flow["state"]):
        raise _Refused("this sign-in was not started in this browser: start again")
    found = oidc.provider()
    try:
        with _client() as client:
            token = client.fetch_token(
                found.endpoint("token_endpoint"),
                grant_type="authorization_code",
                code=request.args.get("code", ""),
                code_verifier=flow["verifier"],
            )
    except (OAuthError, OSError) as exc:
        raise _Refused(f"the identity provider refused the sign-in ({exc})") from None
    try:
        claims = oidc.verified_claims(str(token.get("id_token", "")), get_settings().oidc_client_id)
        if not hmac.compare_digest(str(claims.get("nonce", "")), flow["nonce"]):
            raise _Refused("the identity provider's answer is not for this sign-in")
        return auth.provider_principal(claims, current_app.config["KEEL_TOKEN_MAX_TTL_S"])
    except (jwt.PyJWTError, ApiError) as exc:
        raise _Refused(f"the identity provider's ID token was refused ({exc})") from None


def _flow() -> dict[str, str]:
    raw = request.cookies.get(FLOW_COOKIE, "")
    try:
        flow = _flows().loads(raw, max_age=FLOW_TTL_S)
    except BadSignature:  # expired too (SignatureExpired)
        raise _Refused("this sign-in took too long or was not started here: start again") from None
    if not isinstance(flow, dict) or not all(
        isinstance(flow.get(k), str) for k in ("state", "nonce", "verifier")
    ):
        raise _Refused("this sign-in was not started here: start again")
    return flow
