"""The provider sandbox as campaigns will meet it: a real process spoken to over HTTP.

Campaign tests will trust the sandbox's ledger as the ground truth, so these
tests pin down the provider's contract (limits, silent drops, one send per
group), its faults, and that its state survives a crash. No Postgres, Redis
or Celery is needed.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from keel.embedded import free_port
from provider_sandbox.admin import ADMIN_KEY_HEADER
from tests.support.stack import PROJECT_ROOT, sandbox_admin_headers, wait_for

TIMEOUT_S = 10


@dataclass
class SandboxProcess:
    """``python -m provider_sandbox`` on a free port, data in ``home``."""

    home: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SandboxProcess:
        args = [sys.executable, "-m", "provider_sandbox", "--port", str(self.port)]
        with (self.home / "sandbox.log").open("ab") as log:
            self.process = subprocess.Popen(
                [*args, "--home", str(self.home)],
                cwd=PROJECT_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_for(self._ready, timeout=20)
        return self

    def _ready(self) -> bool:
        assert self.process is not None and self.process.poll() is None, self.log_tail()
        try:
            return requests.get(f"{self.url}/health", timeout=1).ok
        except requests.ConnectionError:
            return False

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=TIMEOUT_S)

    def log_tail(self) -> str:
        path = self.home / "sandbox.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@dataclass
class Provider:
    """A thin HTTP client for the sandbox; every call returns the raw response."""

    url: str
    timeout: float = TIMEOUT_S

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        """Every call carries the admin key; the provider API ignores it."""
        kwargs.setdefault("timeout", self.timeout)
        kwargs["headers"] = {**sandbox_admin_headers(), **kwargs.get("headers", {})}
        return requests.request(method, f"{self.url}{path}", **kwargs)

    def create_group(self, name: str | None = None) -> str:
        response = self.call("POST", "/v1/groups", json={"name": name} if name else None)
        assert response.status_code == 201, response.text
        return response.json()["groupId"]

    def add(self, group_id: str, messages: list[dict]) -> requests.Response:
        return self.call("POST", f"/v1/groups/{group_id}/messages", json={"messages": messages})

    def send(self, group_id: str) -> requests.Response:
        return self.call("POST", f"/v1/groups/{group_id}/send")

    def status(self, group_id: str) -> requests.Response:
        return self.call("GET", f"/v1/groups/{group_id}")

    def count(self, group_id: str) -> int:
        return self.status(group_id).json()["count"]

    def ledger(self, **params: Any) -> dict:
        response = self.call("GET", "/v1/ledger", params=params)
        assert response.status_code == 200, response.text
        return response.json()

    def ledger_of(self, group_id: str) -> dict:
        return self.ledger(groupId=group_id)["groups"][0]

    def set_faults(self, **faults: Any) -> None:
        response = self.call("PUT", "/admin/faults", json=faults)
        assert response.status_code == 200, response.text

    def set_capacity(self, capacity: int) -> None:
        response = self.call("PUT", "/admin/config", json={"capacity": capacity})
        assert response.status_code == 200, response.text


def messages(prefix: str, count: int, start: int = 0) -> list[dict]:
    return [
        {"messageId": f"{prefix}-{i}", "to": f"+8210{i:08d}", "text": "Your coupon is ready"}
        for i in range(start, start + count)
    ]


def assert_error(response: requests.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "message", "details"} and body["message"]
    if code is not None:
        assert body["error"] == code
    return body


def in_parallel(calls: list[Callable[[], requests.Response]]) -> list[requests.Response]:
    """Run the calls at the same instant, one thread each."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], requests.Response]) -> requests.Response:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxProcess]:
    process = SandboxProcess(tmp_path_factory.mktemp("sandbox")).start()
    yield process
    process.stop()


@pytest.fixture
def provider(sandbox: SandboxProcess) -> Provider:
    """The shared sandbox, reset to a fresh server for each test."""
    provider = Provider(sandbox.url)
    assert provider.call("POST", "/admin/reset", json={}).status_code == 204
    return provider


# --- the group API ----------------------------------------------------------------------


def test_a_group_is_created_filled_sent_and_reported(provider: Provider):
    # Given a new group
    group_id = provider.create_group("spring-coupons")
    # When three messages are added and the group is sent
    added = provider.add(group_id, messages("m", 3))
    sent = provider.send(group_id)
    # Then every step answered as the provider does, and the status shows the send
    assert added.status_code == 200 and added.json() == {"accepted": 3, "duplicates": 0}
    assert sent.status_code == 202 and sent.json()["count"] == 3
    status = provider.status(group_id).json()
    assert status["groupId"] == group_id and status["name"] == "spring-coupons"
    assert status["count"] == 3 and status["sent"] is True
    assert status["sentAt"] == sent.json()["sentAt"] and status["createdAt"] <= status["sentAt"]
    entry = provider.ledger_of(group_id)
    assert entry["messages"] == ["m-0", "m-1", "m-2"]
    assert (entry["sendCount"], entry["sentMessages"], entry["deleted"]) == (1, 3, False)


def test_group_ids_are_unique_and_a_new_group_is_empty(provider: Provider):
    # When two groups are created without a body
    first, second = provider.create_group(), provider.create_group()
    # Then they are distinct, empty and unsent
    assert first != second
    status = provider.status(first).json()
    assert (status["count"], status["sent"], status["sentAt"]) == (0, False, None)


def test_an_empty_unsent_group_is_deleted_but_stays_in_the_ledger(provider: Provider):
    # Given an empty group
    group_id = provider.create_group()
    # When it is deleted
    deleted = provider.call("DELETE", f"/v1/groups/{group_id}")
    # Then it is gone from the API, and the ledger remembers it as deleted
    assert deleted.status_code == 204
    assert_error(provider.status(group_id), 404, "group_not_found")
    assert_error(provider.call("DELETE", f"/v1/groups/{group_id}"), 404, "group_not_found")
    assert provider.ledger_of(group_id)["deleted"] is True


def test_a_group_with_messages_or_sent_cannot_be_deleted(provider: Provider):
    # Given a group with a message and an empty group that was sent
    filled, sent = provider.create_group(), provider.create_group()
    provider.add(filled, messages("m", 1))
    assert provider.send(sent).status_code == 202
    # When both are deleted
    answers = [provider.call("DELETE", f"/v1/groups/{g}") for g in (filled, sent)]
    # Then both are refused and still there
    for answer in answers:
        assert_error(answer, 409, "group_not_empty")
    assert provider.count(filled) == 1 and provider.status(sent).json()["sent"] is True


def test_at_most_1000_messages_per_request(provider: Provider):
    # Given a group
    group_id = provider.create_group()
    # When 1,001 messages come in one request, then exactly 1,000
    too_many = provider.add(group_id, messages("m", 1001))
    just_right = provider.add(group_id, messages("m", 1000))
    # Then the first is a 400 that stored nothing, the second is accepted whole
    assert_error(too_many, 400, "too_many_messages")
    assert just_right.json() == {"accepted": 1000, "duplicates": 0}
    assert provider.count(group_id) == 1000


def test_a_message_id_already_in_the_group_is_ignored(provider: Provider):
    # Given a group holding a and b
    group_id = provider.create_group()
    provider.add(group_id, [*messages("a", 1), *messages("b", 1)])
    # When b comes again, with c twice in the same request
    again = provider.add(group_id, [*messages("b", 1), *messages("c", 1), *messages("c", 1)])
    # Then only the first c is new, and every id is stored once
    assert again.status_code == 200 and again.json() == {"accepted": 1, "duplicates": 2}
    assert provider.count(group_id) == 3
    ledger = provider.ledger(groupId=group_id)
    assert ledger["messages"] == {"a-0": 1, "b-0": 1, "c-0": 1}
    assert ledger["groups"][0]["duplicates"] == 2


def test_over_capacity_messages_are_dropped_silently_but_ledgered(provider: Provider):
    # Given a capacity of 5 and a group holding 4
    provider.set_capacity(5)
    group_id = provider.create_group()
    provider.add(group_id, messages("m", 4))
    # When 3 more new messages are added
    answer = provider.add(group_id, messages("m", 3, start=4))
    # Then the answer looks like full success; only the count and the ledger tell
    assert answer.status_code == 200 and answer.json() == {"accepted": 3, "duplicates": 0}
    assert provider.count(group_id) == 5
    entry = provider.ledger_of(group_id)
    assert (entry["count"], entry["dropped"]) == (5, 2)
    assert entry["droppedMessages"] == ["m-5", "m-6"]
    assert provider.ledger(summary=1)["totals"]["dropped"] == 2
    assert provider.call("GET", "/admin/config").json() == {"capacity": 5}


def test_a_second_send_is_rejected(provider: Provider):
    # Given a sent group
    group_id = provider.create_group()
    provider.add(group_id, messages("m", 2))
    assert provider.send(group_id).status_code == 202
    # When it is triggered again
    again = provider.send(group_id)
    # Then the trigger is refused, and the ledger shows one send and one refusal
    assert_error(again, 409, "group_already_sent")
    entry = provider.ledger_of(group_id)
    assert (entry["sendCount"], entry["rejectedSends"]) == (1, 1)


def test_adding_to_a_sent_group_is_rejected(provider: Provider):
    # Given a sent group of 2
    group_id = provider.create_group()
    provider.add(group_id, messages("m", 2))
    provider.send(group_id)
    # When more messages come
    late = provider.add(group_id, messages("late", 2))
    # Then they are refused and the group is unchanged
    assert_error(late, 409, "group_already_sent")
    assert provider.ledger_of(group_id)["messages"] == ["m-0", "m-1"]


@pytest.mark.parametrize(
    ("body", "content_type"),
    [
        (b"{not json", "application/json"),
        (b"[1, 2]", "application/json"),
        (b"", "application/json"),
        (b'{"messages": [], "x": 1}', "application/json"),
        (b'{"messages": []}', "application/json"),
        (b'{"messages": [{"messageId": "a", "to": "1"}]}', "application/json"),
        (b'{"messages": [{"messageId": 7, "to": "1", "text": "t"}]}', "application/json"),
        (
            b'{"messages": [{"messageId": "a", "to": "1", "text": "t", "cc": "2"}]}',
            "application/json",
        ),
        (b'{"messages": ["a"]}', "application/json"),
        (b"\xff\xfe", "application/json"),
    ],
)
def test_bad_input_is_a_400_in_the_error_shape(provider: Provider, body, content_type):
    # Given a group
    group_id = provider.create_group()
    # When a malformed add arrives
    headers = {"Content-Type": content_type} if content_type else {}
    answer = provider.call("POST", f"/v1/groups/{group_id}/messages", data=body, headers=headers)
    # Then it is a 400, never a 500, and nothing was stored
    assert_error(answer, 400)
    assert provider.count(group_id) == 0


@pytest.mark.parametrize("content_type", ["text/plain", None, "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_json_is_refused_whatever_it_holds(provider: Provider, content_type):
    # Given a group; When a well-formed add arrives without the JSON type (as a form or a
    # cross-site text/plain POST would)
    group_id = provider.create_group()
    body = b'{"messages": [{"messageId": "a", "to": "1", "text": "t"}]}'
    headers = {"Content-Type": content_type} if content_type else {}
    answer = provider.call("POST", f"/v1/groups/{group_id}/messages", data=body, headers=headers)
    # Then it is refused as such, and nothing was stored
    assert_error(answer, 415, "unsupported_media_type")
    assert provider.count(group_id) == 0


def test_other_bad_requests_are_json_errors(provider: Provider):
    # When unknown groups, fields, values and routes are asked for
    # Then each is a JSON error with the right status
    assert_error(provider.status("grp_nope"), 404, "group_not_found")
    assert_error(provider.send("grp_nope"), 404, "group_not_found")
    assert_error(provider.call("POST", "/v1/groups", json={"title": "x"}), 400)
    assert_error(provider.call("GET", "/v1/ledger", params={"group": "x"}), 400)
    assert_error(provider.call("GET", "/v1/ledger", params={"groupId": "grp_nope"}), 404)
    assert_error(provider.call("PUT", "/admin/faults", json={"errorRate": 1.5}), 400)
    assert_error(provider.call("PUT", "/admin/faults", json={"seed": "x"}), 400)
    assert_error(provider.call("PUT", "/admin/config", json={"capacity": 0}), 400)
    assert_error(provider.call("GET", "/v2/anything"), 404)
    assert_error(provider.call("PATCH", "/v1/groups"), 405)


def test_admin_and_ledger_need_the_admin_key_and_json_bodies(provider: Provider):
    # Given the sandbox of the session, whose key the provider client sends
    routes = [
        ("GET", "/v1/ledger"),
        ("GET", "/admin/faults"),
        ("PUT", "/admin/faults"),
        ("GET", "/admin/config"),
        ("PUT", "/admin/config"),
        ("POST", "/admin/reset"),
    ]
    for method, path in routes:
        # When called without the key, or with another one: 401 in the error shape
        for headers in ({}, {ADMIN_KEY_HEADER: "not-the-key"}):
            response = requests.request(
                method, f"{provider.url}{path}", json={}, headers=headers, timeout=TIMEOUT_S
            )
            assert_error(response, 401, "unauthorized")
    # And a body that is not JSON (a cross-origin form or text/plain post): 415, key or not
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        response = provider.call(
            "POST", "/admin/reset", data="{}", headers={"Content-Type": content_type}
        )
        assert_error(response, 415, "unsupported_media_type")
    # While the provider API itself needs no admin key
    assert requests.post(f"{provider.url}/v1/groups", json={}, timeout=TIMEOUT_S).status_code == 201


def test_the_ledger_counts_a_message_accepted_by_several_groups(provider: Provider):
    # Given message x accepted by two groups, and y by one
    first, second = provider.create_group(), provider.create_group()
    provider.add(first, messages("x", 1))
    provider.add(second, [*messages("x", 1), *messages("y", 1)])
    # When the ledger is read whole, filtered and summarized
    whole = provider.ledger()
    filtered = provider.ledger(groupId=first)
    summary = provider.ledger(summary=1)
    # Then x shows two acceptances everywhere, and the summary lists no messages
    assert whole["messages"] == {"x-0": 2, "y-0": 1}
    assert [g["groupId"] for g in whole["groups"]] == [first, second]
    assert [g["groupId"] for g in filtered["groups"]] == [first]
    assert filtered["messages"] == {"x-0": 2}
    assert "messages" not in summary and "messages" not in summary["groups"][0]
    totals = summary["totals"]
    assert (totals["groups"], totals["accepted"], totals["distinctMessages"]) == (2, 3, 2)
    assert totals["messagesInSeveralGroups"] == 1
    assert totals["messagesInSeveralGroupsSample"] == ["x-0"]


# --- faults -------------------------------------------------------------------------------


def statuses(provider: Provider, group_id: str, count: int) -> list[int]:
    return [provider.status(group_id).status_code for _ in range(count)]


def test_the_error_rate_replays_the_same_failures_for_the_same_seed(provider: Provider):
    # Given a group and a 30% error rate with seed 7
    group_id = provider.create_group()
    provider.set_faults(errorRate=0.3, seed=7)
    # When it is read 100 times, then again after the same seed is set again
    first = statuses(provider, group_id, 100)
    provider.set_faults(errorRate=0.3, seed=7)
    second = statuses(provider, group_id, 100)
    provider.set_faults(errorRate=0.3, seed=8)
    other_seed = statuses(provider, group_id, 100)
    # Then about 30% failed with 503, in exactly the same places
    assert set(first) == {200, 503} and 15 <= first.count(503) <= 45
    assert second == first and other_seed != first
    provider.set_faults(errorRate=1)
    assert_error(provider.status(group_id), 503, "unavailable")


def test_faults_hit_the_provider_api_only(provider: Provider):
    # Given every provider request fails
    group_id = provider.create_group()
    provider.set_faults(errorRate=1)
    # When the provider API, the ledger and the admin API are called
    # Then only the provider API fails
    assert provider.status(group_id).status_code == 503
    assert provider.ledger_of(group_id)["groupId"] == group_id
    assert provider.call("GET", "/admin/faults").json()["errorRate"] == 1


def test_over_the_rate_limit_requests_get_429_with_retry_after(provider: Provider):
    # Given a limit of 5 requests per second
    group_id = provider.create_group()
    provider.set_faults(rateLimitPerSecond=5)
    # When 15 requests come as fast as they can
    started = time.monotonic()
    answers = [provider.status(group_id) for _ in range(15)]
    refilled = math.ceil((time.monotonic() - started) * 5)
    # Then the burst of 5 (plus what refilled meanwhile) passed, the rest got 429
    passed = [a for a in answers if a.status_code == 200]
    limited = [a for a in answers if a.status_code == 429]
    assert 5 <= len(passed) <= 5 + refilled and len(passed) + len(limited) == 15
    assert limited, "the burst should have been exceeded"
    assert all(a.status_code == 200 for a in answers[:5])
    for answer in limited:
        assert_error(answer, 429, "rate_limited")
        assert int(answer.headers["Retry-After"]) >= 1
    # And after waiting as told, requests pass again
    time.sleep(int(limited[-1].headers["Retry-After"]))
    assert provider.status(group_id).status_code == 200


@pytest.mark.parametrize("mode", ["503", "close"])
def test_a_lost_response_still_commits_the_change(provider: Provider, mode: str):
    # Given every provider response is lost after the work is done
    group_id = provider.create_group()
    provider.set_faults(dropResponseRate=1, dropResponseMode=mode)
    # When messages are added and the group is sent
    answers = [attempt(lambda: provider.add(group_id, messages("m", 10)))]
    answers.append(attempt(lambda: provider.send(group_id)))
    # Then the client saw failures, yet both changes happened
    expected = 503 if mode == "503" else "connection lost"
    assert answers == [expected, expected]
    provider.set_faults()
    assert provider.count(group_id) == 10
    # And the client's retry of the send is refused: the ledger shows one send
    assert_error(provider.send(group_id), 409, "group_already_sent")
    assert provider.ledger_of(group_id)["sendCount"] == 1


def attempt(call: Callable[[], requests.Response]) -> int | str:
    try:
        return call().status_code
    except requests.ConnectionError:
        return "connection lost"


def test_a_timeout_outlasts_the_client_and_changes_nothing(provider: Provider):
    # Given every provider request is held for 2 s
    group_id = provider.create_group()
    provider.set_faults(timeoutRate=1, timeoutMs=2000)
    # When a client that waits 0.5 s adds messages
    with pytest.raises(requests.Timeout):
        Provider(provider.url, timeout=0.5).add(group_id, messages("m", 5))
    # Then nothing was stored
    provider.set_faults()
    assert provider.count(group_id) == 0


def test_latency_slows_provider_requests(provider: Provider):
    # Given 300 ms of latency
    group_id = provider.create_group()
    provider.set_faults(latencyMs=300, latencyJitterMs=50, seed=1)
    # When a group is read
    started = time.monotonic()
    answer = provider.status(group_id)
    # Then it succeeded after at least the latency
    assert answer.status_code == 200 and time.monotonic() - started >= 0.3


# --- concurrency --------------------------------------------------------------------------


def test_concurrent_adds_never_exceed_the_capacity(provider: Provider):
    # Given a capacity of 2,500 and one group
    provider.set_capacity(2500)
    group_id = provider.create_group()
    # When 8 threads each add 2 batches of 500 new messages at the same time
    batches = [messages(f"t{t}-b{b}", 500) for t in range(8) for b in range(2)]
    answers = in_parallel([lambda batch=batch: provider.add(group_id, batch) for batch in batches])
    # Then every request looked accepted, yet exactly 2,500 were stored
    assert all(a.json() == {"accepted": 500, "duplicates": 0} for a in answers)
    entry = provider.ledger(groupId=group_id)["groups"][0]
    assert (entry["count"], len(entry["messages"]), entry["dropped"]) == (2500, 2500, 5500)
    assert provider.count(group_id) == 2500


def test_concurrent_adds_of_the_same_messages_store_each_once(provider: Provider):
    # Given one group
    group_id = provider.create_group()
    batch = messages("same", 1000)
    # When 8 threads add the same 1,000 messages at the same time
    answers = in_parallel([lambda: provider.add(group_id, batch)] * 8)
    # Then each message was accepted by exactly one request
    bodies = [a.json() for a in answers]
    assert sum(b["accepted"] for b in bodies) == 1000
    assert sum(b["duplicates"] for b in bodies) == 7000
    assert set(provider.ledger(groupId=group_id)["messages"].values()) == {1}


def test_concurrent_sends_trigger_exactly_once(provider: Provider):
    # Given a loaded group
    group_id = provider.create_group()
    provider.add(group_id, messages("m", 100))
    # When 8 threads trigger the send at the same time
    answers = in_parallel([lambda: provider.send(group_id)] * 8)
    # Then exactly one trigger won
    assert Counter(a.status_code for a in answers) == {202: 1, 409: 7}
    entry = provider.ledger_of(group_id)
    assert (entry["sendCount"], entry["rejectedSends"], entry["sentMessages"]) == (1, 7, 100)


# --- the process --------------------------------------------------------------------------


def test_state_survives_a_crash_and_restart(tmp_path: Path):
    # Given a sandbox with a sent group, a loaded group, a capacity and faults set
    before = SandboxProcess(tmp_path).start()
    provider = Provider(before.url)
    provider.set_capacity(50)
    sent, loaded = provider.create_group(), provider.create_group()
    provider.add(sent, messages("s", 3))
    provider.send(sent)
    provider.add(loaded, messages("l", 60))
    provider.set_faults(errorRate=0.5, seed=3)
    ledger = provider.ledger()
    # When it is killed and started again on the same home
    before.stop(signal.SIGKILL)
    after = SandboxProcess(tmp_path).start()
    provider = Provider(after.url)
    # Then everything is as it was: the ledger, the settings, the one send
    try:
        assert provider.ledger() == ledger
        assert provider.call("GET", "/admin/config").json() == {"capacity": 50}
        assert provider.call("GET", "/admin/faults").json()["errorRate"] == 0.5
        provider.set_faults()
        assert provider.count(loaded) == 50
        assert_error(provider.send(sent), 409, "group_already_sent")
    finally:
        after.stop()


def test_sigterm_stops_the_server_cleanly(tmp_path: Path):
    # Given a running sandbox
    process = SandboxProcess(tmp_path).start()
    # When it gets SIGTERM
    code = process.stop(signal.SIGTERM)
    # Then it exits with 0 and says so
    assert code == 0
    assert "provider sandbox stopped" in process.log_tail()
