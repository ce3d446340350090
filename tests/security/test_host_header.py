"""A request's Host header never becomes a redirect or a link; KEEL_TRUSTED_HOSTS refuses others.

Every GET route of the app (path parameters filled with a made-up id) is
asked for with ``Host: evil.example``, signed out and signed in as an
operator, and every form's redirect after a POST too: the attacker's host
must appear in no ``Location`` header and no page.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
from flask import Flask

from tasks.platform.config import reload_settings
from tests.support.client import bearer, unique
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("stack")
EVIL = "evil.example"
HOSTILE = {"Host": EVIL, **PAGE}
TENANT = unique("hosts")


@pytest.fixture
def settings(request) -> Iterator[None]:
    """The KEEL_* variables of the test's ``request.param`` for its duration, then as before."""
    given: dict[str, str] = request.param
    before = {name: os.environ.get(name) for name in given}
    os.environ.update(given)
    reload_settings()
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    reload_settings()


def get_paths(app: Flask) -> list[str]:
    """Every GET route, its path parameters filled in."""
    paths = []
    for rule in app.url_map.iter_rules():
        if "GET" not in (rule.methods or ()) or rule.endpoint == "static":
            continue
        paths.append(re.sub(r"<(?:[^:>]+:)?([^>]+)>", "x1", rule.rule))
    return sorted(set(paths))


class AsHost:
    """A signed-in client's requests sent for another host, its session cookie by hand
    (its jar keeps the cookie for localhost, and would not send it)."""

    def __init__(self, app: Flask, client) -> None:
        self.bare = app.test_client(use_cookies=False)
        cookie = client.get_cookie("keel_session")
        self.cookie = {"Cookie": f"keel_session={cookie.value}"} if cookie else {}

    def get(self, path: str, headers: dict[str, str]):
        return self.bare.get(path, headers={**headers, **self.cookie})

    def post(self, path: str, headers: dict[str, str], **kwargs):
        return self.bare.post(path, headers={**headers, **self.cookie}, **kwargs)


def assert_clean(response, path: str) -> None:
    location = response.headers.get("Location", "")
    assert EVIL not in location, (path, location)
    assert EVIL not in response.get_data(as_text=True), path


@pytest.mark.parametrize("settings", [{"KEEL_PUBLIC_URL": "", "KEEL_WEB_URL": ""}], indirect=True)
def test_no_route_echoes_the_host_signed_out_or_in(app: Flask, settings):
    anonymous = AsHost(app, app.test_client())
    operator = AsHost(app, signed_in(app, TENANT, "olga", ("operator",)))
    paths = get_paths(app)
    assert "/ui" in [p.rstrip("/") for p in paths]
    assert operator.get("/ui/jobs", headers=HOSTILE).status_code == 200
    for path in paths:
        for client in (anonymous, operator):
            assert_clean(client.get(path, headers=HOSTILE), path)
            assert_clean(client.get(path.rstrip("/"), headers=HOSTILE), path)


@pytest.mark.parametrize("settings", [{"KEEL_PUBLIC_URL": "", "KEEL_WEB_URL": ""}], indirect=True)
def test_the_slash_redirect_is_a_path_when_no_public_url_is_set(app: Flask, settings):
    response = app.test_client().get("/ui", headers=HOSTILE)
    assert response.status_code in (301, 308), response.status_code
    assert response.headers["Location"] == "/ui/"


@pytest.mark.parametrize(
    "settings", [{"KEEL_PUBLIC_URL": "https://keel.example.org"}], indirect=True
)
def test_redirects_and_flower_link_use_the_public_url(app: Flask, settings):
    response = app.test_client().get("/ui", headers=HOSTILE)
    assert response.headers["Location"] == "https://keel.example.org/ui/"
    operator = AsHost(app, signed_in(app, TENANT, "olga", ("operator",)))
    page = operator.get("/ui/jobs", headers=HOSTILE)
    assert page.status_code == 200
    assert 'href="https://keel.example.org:' in page.get_data(as_text=True)  # Flower's link
    assert_clean(page, "/ui/jobs")


@pytest.mark.parametrize("settings", [{"KEEL_PUBLIC_URL": "", "KEEL_WEB_URL": ""}], indirect=True)
def test_a_forms_redirect_never_names_the_host(app: Flask, settings):
    signed = signed_in(app, TENANT, "olga", ("operator",))
    form = {"csrf_token": csrf_token(signed)}
    client = AsHost(app, signed)
    headers = {**HOSTILE, "Referer": f"http://{EVIL}/ui/jobs", "Origin": f"http://{EVIL}"}
    for path in ("/ui/jobs/x1/cancel", "/ui/schedulers/s1/delete", "/ui/logout"):
        assert_clean(client.post(path, data=form, headers=headers), path)


@pytest.mark.parametrize(
    "settings", [{"KEEL_TRUSTED_HOSTS": "keel.example.org,.internal.example"}], indirect=True
)
def test_trusted_hosts_refuse_any_other_host_but_probes_answer(app: Flask, settings):
    client = app.test_client()
    refused = client.get("/api/v1/jobs", headers={"Host": EVIL, **bearer()})
    assert refused.status_code == 400
    assert refused.get_json()["error"] == "untrusted_host"
    page = client.get("/ui/signin", headers=HOSTILE)
    assert page.status_code == 400 and EVIL not in page.get_data(as_text=True)
    for host in ("keel.example.org", "api.internal.example", "internal.example:8000"):
        assert client.get("/api/v1/jobs", headers={"Host": host, **bearer()}).status_code == 200
    # Probes come from an orchestrator, addressed to a pod's IP
    assert client.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
