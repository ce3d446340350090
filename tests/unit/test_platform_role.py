"""The platform role is a mark of the link ``keel ui-link --platform`` signs, never a name in a
token's roles: a Keel token, an identity provider's claims or a tenant's link naming
"platform" make a tenant's principal (pure functions: no server)."""

from __future__ import annotations

import secrets

import pytest

from web import auth
from web.tokens import issue_token
from web.ui import session

SECRET = secrets.token_urlsafe(48)
ROLES = ["operator", "platform"]


def test_a_keel_token_naming_the_platform_role_is_its_tenants():
    principal = auth.decode(issue_token(SECRET, "acme", "mallory", ROLES, 60), SECRET, 3600)
    assert (principal.tenant_id, principal.platform, principal.operator) == ("acme", False, True)


def test_an_identity_providers_claims_naming_the_platform_role_are_its_tenants():
    claims = {"tenant": "acme", "sub": "mallory", "roles": ROLES, "iat": 1, "exp": 61}
    principal = auth.provider_principal(claims, 3600)
    assert (principal.tenant_id, principal.platform) == ("acme", False)


@pytest.mark.parametrize("platform", [False, None, "yes", 1])
def test_only_the_platform_mark_itself_makes_a_platform_principal(platform):
    principal = session._principal("acme", "mallory", ROLES, platform)
    assert (principal.tenant_id, principal.platform) == ("acme", False)
    marked = session._principal(None, "root", [], True)
    assert (marked.tenant_id, marked.platform, marked.roles) == ("*", True, ("platform",))
    assert not auth.is_id(marked.tenant_id)  # no tenant's id, nor any query's
