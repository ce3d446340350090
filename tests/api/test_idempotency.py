"""``Idempotency-Key`` on the creating endpoints (``web.idempotency``): a request sent again
with the same key does its work once and answers alike."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from tasks.platform.db import transaction
from tests.support.client import bearer, unique

JOBS = "/api/v1/jobs"
LATER = {"delay": 86_400_000}  # a day: nothing runs while the test looks


def jobs_named(tenant: str, marker: str) -> int:
    with transaction() as session:
        return int(
            session.execute(
                text("SELECT count(*) FROM jobs WHERE tenant_id = :t AND data->>'marker' = :m"),
                {"t": tenant, "m": marker},
            ).scalar_one()
        )


def post(client, body: dict, key: str | None, tenant: str, user: str = "alice"):
    headers = {**bearer(tenant, user), **({"Idempotency-Key": key} if key is not None else {})}
    return client.post(JOBS, json=body, headers=headers)


def echo(marker: str) -> dict:
    return {"name": "test.echo", "data": {"marker": marker}, "opts": LATER}


def test_fifty_concurrent_posts_with_one_key_make_one_job_and_answer_alike(app):
    tenant, marker, key = unique("idem"), unique("m"), unique("key")
    start = threading.Barrier(50)

    def send(_n: int) -> tuple[int, dict, str | None]:
        client = app.test_client()
        start.wait()
        answer = post(client, echo(marker), key, tenant)
        return answer.status_code, answer.get_json(), answer.headers.get("Idempotent-Replayed")

    with ThreadPoolExecutor(50) as pool:
        answers = list(pool.map(send, range(50)))
    assert {(status, tuple(sorted(body.items()))) for status, body, _ in answers} == {
        (answers[0][0], tuple(sorted(answers[0][1].items())))
    }, answers[:3]
    assert answers[0][0] == 202
    assert sum(1 for *_, replayed in answers if replayed == "true") == 49
    assert jobs_named(tenant, marker) == 1


def test_the_same_key_with_another_request_is_422_and_another_users_key_is_its_own(client):
    tenant, key = unique("idem"), unique("key")
    first = post(client, echo(unique("m")), key, tenant)
    assert first.status_code == 202
    reused = post(client, echo(unique("m")), key, tenant)
    assert reused.status_code == 422, reused.get_json()
    assert reused.get_json()["error"] == "idempotency_key_reused"
    # Another user of the tenant, same key and body as the first: a job of its own
    other = post(client, echo(unique("m")), key, tenant, user="bob")
    assert other.status_code == 202 and other.get_json()["jobId"] != first.get_json()["jobId"]


def test_a_failed_request_keeps_no_key_and_an_expired_key_is_new_again(client):
    tenant, key, marker = unique("idem"), unique("key"), unique("m")
    refused = post(client, {"name": "test.sleep", "data": {}}, key, tenant)  # not submittable
    assert refused.status_code == 400
    first = post(client, echo(marker), key, tenant)  # the key was given back: runs
    assert first.status_code == 202 and "Idempotent-Replayed" not in first.headers
    again = post(client, echo(marker), key, tenant)
    assert again.get_json() == first.get_json() and again.headers["Idempotent-Replayed"] == "true"
    # Once KEEL_IDEMPOTENCY_TTL_S has passed (its expiry moved to the past here), a new job
    with transaction() as session:
        session.execute(
            text(
                "UPDATE idempotency_keys SET expires_at = clock_timestamp() - interval '1 s' "
                "WHERE tenant_id = :t AND key = :k"
            ),
            {"t": tenant, "k": key},
        )
    with transaction() as session:  # (its job gone too, as retention would have taken it)
        session.execute(text("DELETE FROM jobs WHERE id = :id"), {"id": first.get_json()["jobId"]})
    later = post(client, echo(marker), key, tenant)
    assert later.status_code == 202 and "Idempotent-Replayed" not in later.headers
    assert jobs_named(tenant, marker) == 1


def test_a_retry_after_an_answer_that_was_never_stored_finds_the_first_job(client):
    """The server made the job and died before keeping its answer: the key's row is gone
    (or its lease ran out); the retry derives the same job id and makes no second job."""
    tenant, key, marker = unique("idem"), unique("key"), unique("m")
    first = post(client, echo(marker), key, tenant)
    with transaction() as session:
        session.execute(
            text("DELETE FROM idempotency_keys WHERE tenant_id = :t AND key = :k"),
            {"t": tenant, "k": key},
        )
    retried = post(client, echo(marker), key, tenant)
    assert retried.status_code == 202
    assert retried.get_json()["jobId"] == first.get_json()["jobId"]
    assert jobs_named(tenant, marker) == 1


def test_a_report_sent_twice_with_a_key_is_one_answer(client):
    tenant, key = unique("idem"), unique("key")
    body = {"reportId": unique("q"), "rows": 10}
    headers = {**bearer(tenant, "alice"), "Idempotency-Key": f'"{key}"'}  # a quoted sf-string
    first = client.post("/api/v1/reports", json=body, headers=headers)
    again = client.post("/api/v1/reports", json=body, headers=headers)
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.get_json() == first.get_json() and again.headers["Idempotent-Replayed"] == "true"


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "two words"])
def test_a_key_that_is_not_one_is_400(client, key):
    answer = post(client, echo(unique("m")), key, unique("idem"))
    assert answer.status_code == 400, answer.get_json()
    assert answer.get_json()["details"][0]["field"] == "Idempotency-Key"
