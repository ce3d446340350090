"""Scenario 10: what another local user could reach on a machine running ``keel up``.

Any local user can read every process's command line and connect to any
loopback port; only the owner can read ``$KEEL_HOME`` (created 0700/0600
from the first byte) and the stack's process environments. So secrets live
in those two places only, the embedded Redis needs a password and refuses
``CONFIG``, and the sandbox's admin routes need a key and JSON bodies.
"""

from __future__ import annotations

import stat
from urllib.parse import urlsplit

import pytest
import redis
import requests
from redis.backoff import NoBackoff
from redis.retry import Retry

from provider_sandbox.admin import ADMIN_KEY_HEADER
from tests.security.conftest import record_figure
from tests.support.keel_up import KeelUp, alive


def secrets_of(up: KeelUp) -> dict[str, str]:
    env = up.stack_env
    found = {
        "KEEL_SECRET_KEY": env["KEEL_SECRET_KEY"],
        "KEEL_FLOWER_PASSWORD": env["KEEL_FLOWER_PASSWORD"],
        "KEEL_SANDBOX_ADMIN_KEY": env["KEEL_SANDBOX_ADMIN_KEY"],
        "KEEL_METRICS_TOKEN": env["KEEL_METRICS_TOKEN"],
        "redis password": urlsplit(env["KEEL_REDIS_URL"]).password or "",
    }
    assert all(len(value) >= 16 for value in found.values()), "a secret is missing or short"
    return found


def test_the_embedded_redis_wants_a_password_and_refuses_config(keel_up: KeelUp):
    url = urlsplit(keel_up.stack_env["KEEL_REDIS_URL"])
    # Without the password: nothing, CONFIG SET included
    anonymous = redis.Redis(
        host=url.hostname, port=url.port, socket_timeout=5, retry=Retry(NoBackoff(), 0)
    )
    with pytest.raises(redis.AuthenticationError):
        anonymous.config_set("dir", "/tmp")
    with pytest.raises(redis.AuthenticationError):
        anonymous.set("planted", "1")
    # With it: still no CONFIG (it could point the server's files anywhere)
    owner = redis.Redis.from_url(keel_up.stack_env["KEEL_REDIS_URL"], socket_timeout=5)
    assert owner.ping()
    with pytest.raises(redis.ResponseError, match="unknown command"):
        owner.config_set("dir", "/tmp")


def test_no_secret_is_on_any_command_line_of_the_stack(keel_up: KeelUp):
    secrets = secrets_of(keel_up)
    processes = alive(keel_up.tree())
    leaks = []
    for process in processes:
        try:
            with open(f"/proc/{process.pid}/cmdline", "rb") as handle:
                cmdline = handle.read().decode(errors="replace")
        except FileNotFoundError:
            continue
        leaks += [(process.pid, name) for name, value in secrets.items() if value in cmdline]
    record_figure("command lines checked for secrets", f"{len(processes)} processes, 0 leaks")
    assert len(processes) > 10 and not leaks, leaks


def test_the_sandbox_admin_and_ledger_need_the_key_and_json(keel_up: KeelUp):
    sandbox = keel_up.stack_env["KEEL_PROVIDER_URL"]
    key = {ADMIN_KEY_HEADER: keel_up.stack_env["KEEL_SANDBOX_ADMIN_KEY"]}
    # Without the key, or with a wrong one: 401 in the error shape
    for headers in ({}, {ADMIN_KEY_HEADER: "wrong"}):
        for method, path in (
            ("GET", "/v1/ledger"),
            ("GET", "/admin/faults"),
            ("POST", "/admin/reset"),
            ("PUT", "/admin/config"),
        ):
            response = requests.request(method, sandbox + path, headers=headers, json={}, timeout=5)
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"] == "unauthorized"
    # A form or text/plain body (what a web page can send cross-origin): 415, even with the key
    plain = requests.post(
        sandbox + "/admin/reset",
        data="{}",
        timeout=5,
        headers={**key, "Content-Type": "text/plain"},
    )
    assert plain.status_code == 415, plain.text
    # With the key: the ledger and the admin API answer
    assert (
        requests.get(
            sandbox + "/v1/ledger", params={"summary": 1}, headers=key, timeout=5
        ).status_code
        == 200
    )
    assert requests.get(sandbox + "/admin/config", headers=key, timeout=5).status_code == 200


def test_nothing_under_keel_home_is_readable_by_group_or_others(keel_up: KeelUp):
    exposed = []
    checked = 0
    for path in [*keel_up.home.rglob("*")]:
        try:
            mode = path.lstat().st_mode
        except FileNotFoundError:  # a server's temporary file, gone meanwhile
            continue
        checked += 1
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            exposed.append((str(path.relative_to(keel_up.home)), oct(stat.S_IMODE(mode))))
    record_figure("files under KEEL_HOME checked", f"{checked}, {len(exposed)} open to others")
    names = {path.name for path in keel_up.home.iterdir()}
    assert {"env", "secret", "lock", "pg", "redis", "sandbox"} <= names
    assert checked > 100 and not exposed, exposed
