"""One user cannot take every event-stream slot: shares per user and per tenant, in a real gunicorn.

Before, the ~192 stream slots of a default server (2 processes x 96) were
shared by everyone: 200 streams from one user took 189 of them and another
tenant got 503 on its API and dashboard streams. Now a user holds at most
``KEEL_STREAMS_PER_USER`` and a tenant ``KEEL_STREAMS_PER_TENANT`` open
streams (``web.stream_leases``), counted in Redis across the processes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import requests

from tests.support.client import bearer, token, unique
from tests.support.stack import WebProcess, wait_for
from tests.support.streams import Stream, open_stream
from web.stream_leases import DEFAULT_PER_USER
from web.ui.session import issue_link

FLOOD = 200
NEIGHBOUR_STREAMS = 3


@pytest.fixture(scope="module")
def web(stack) -> Iterator[WebProcess]:
    """A server as ``keel up`` runs it: default processes, threads and shares."""
    server = WebProcess(stack.home)
    server.start()
    yield server
    server.stop()


def delayed_job(web: WebProcess, headers: dict) -> str:
    """A report job that stays delayed for an hour: its stream stays open until its timeout."""
    run_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    response = requests.post(
        f"{web.url}/api/v1/reports/scheduled",
        headers=headers,
        json={"reportId": unique("share"), "rows": 5, "runAt": run_at},
        timeout=10,
    )
    assert response.status_code == 202, response.text
    return response.json()["jobId"]


def dashboard_session(web: WebProcess, tenant: str, user: str) -> requests.Session:
    """A browser-like session signed in to the dashboard through a one-time link."""
    session = requests.Session()
    link = issue_link(os.environ["KEEL_SECRET_KEY"], tenant, user, [], 60)
    response = session.get(f"{web.url}/ui/login/{link}", allow_redirects=False, timeout=10)
    assert response.status_code == 303, response.text
    return session


def status(stream: Stream) -> int:
    return int(stream.head.split(b" ", 2)[1]) if stream.head else 0


def test_one_users_200_streams_leave_another_tenant_its_streams(web):
    # Given a user of one tenant whose script opens 200 event streams at once
    flooder = (unique("flood"), "script")
    path = f"/api/v1/reports/jobs/{delayed_job(web, bearer(*flooder))}/events?timeout=60"
    flood: list[Stream] = []
    refused: list[tuple[bytes, str]] = []  # (head, body) of each refusal
    neighbour_streams: list = []
    try:
        for _ in range(FLOOD):
            stream = open_stream(web.port, path, token(*flooder))
            if status(stream) == 200:
                flood.append(stream)
            else:  # a client closes a refused stream's connection (Connection: close)
                refused.append((stream.head, stream.read_to_end(5)[0].decode(errors="replace")))
        accepted = list(flood)
        print(f"\n{FLOOD} streams from one user: {len(accepted)} accepted, {len(refused)} refused")
        # Then the user gets its share, and 503 + Retry-After naming the cap for the rest
        assert len(accepted) == DEFAULT_PER_USER, (len(accepted), len(refused))
        assert len(refused) == FLOOD - DEFAULT_PER_USER
        assert all(head.startswith(b"HTTP/1.1 503") for head, _ in refused), refused[0]
        assert all(b"retry-after:" in head.lower() for head, _ in refused)
        assert b"streamsPerUser" in refused[-1][0] + refused[-1][1].encode(), refused[-1]
        # When another tenant opens its streams meanwhile, through the API and the dashboard
        tenant, user = unique("calm"), "bob"
        job_id = delayed_job(web, bearer(tenant, user))
        api_path = f"/api/v1/reports/jobs/{job_id}/events?timeout=60"
        api_streams = [
            open_stream(web.port, api_path, token(tenant, user)) for _ in range(NEIGHBOUR_STREAMS)
        ]
        neighbour_streams += api_streams
        browser = dashboard_session(web, tenant, user)
        pages = [
            browser.get(f"{web.url}/ui/jobs/{job_id}/events", stream=True, timeout=10)
            for _ in range(NEIGHBOUR_STREAMS)
        ]
        neighbour_streams += pages
        # Then every one of them is open: none is 503
        assert [status(s) for s in api_streams] == [200] * NEIGHBOUR_STREAMS
        assert [p.status_code for p in pages] == [200] * NEIGHBOUR_STREAMS, pages[-1].text
        # And when the user closes one of its streams, it may open another (its lease is freed)
        accepted[0].close()

        def reopened() -> Stream | None:
            stream = open_stream(web.port, path, token(*flooder))
            if status(stream) == 200:
                return stream
            stream.close()
            return None

        flood.append(wait_for(reopened, timeout=5, interval=0.2))
    finally:
        for stream in flood + neighbour_streams:
            stream.close()
