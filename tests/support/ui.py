"""Signing a test client in to the dashboard the way a browser does: through a one-time link."""

from __future__ import annotations

import re

from flask import Flask
from flask.testing import FlaskClient

from web.ui.session import issue_link, issue_platform_link

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')
PAGE = {"Accept": "text/html"}


def signed_in(app: Flask, tenant: str, user: str, roles: tuple[str, ...] = ()) -> FlaskClient:
    """A client holding a dashboard session for ``user`` of ``tenant``."""
    client = app.test_client()
    token = issue_link(app.config["SECRET_KEY"], tenant, user, list(roles), 60)
    response = client.get(f"/ui/login/{token}")
    assert response.status_code == 303, response.get_data(as_text=True)
    return client


def signed_in_platform(app: Flask, user: str) -> FlaskClient:
    """A client holding a platform session (``keel ui-link --platform``) for ``user``."""
    client = app.test_client()
    token = issue_platform_link(app.config["SECRET_KEY"], user, 60)
    response = client.get(f"/ui/login/{token}")
    assert response.status_code == 303, response.get_data(as_text=True)
    return client


def csrf_token(client: FlaskClient) -> str:
    """The CSRF token of the client's session, as its pages' forms carry it."""
    page = client.get("/ui/signin", headers=PAGE).get_data(as_text=True)
    found = CSRF_FIELD.search(page)
    assert found, "no form on the page"
    return found.group(1)
