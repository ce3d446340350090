"""The dashboard's scheduler pages and their policies: the form saves them as the API does,
the pages show them, and pause, resume and run now act as the API's endpoints."""

from __future__ import annotations

import re

import pytest

from tests.support.client import bearer, unique
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("policy-pages")
OPERATOR = ("operator",)
API = bearer(tenant=TENANT, user="olga", roles=OPERATOR)


def flashes(response) -> list[str]:
    return re.findall(r'class="flash \w+" role="\w+">([^<]*)<', response.get_data(as_text=True))


def form(operator, scheduler_id: str, **fields: str) -> dict[str, str]:
    return {
        "csrf_token": csrf_token(operator),
        "id": scheduler_id,
        "rule": "every",
        "every": "60000",
        "name": "test.echo",
        "data": "{}",
        "opts": '{"delay": 86400000}',  # its jobs stay live: run now meets the overlap policy
        **fields,
    }


def test_the_form_saves_the_policies_and_the_pages_show_them(app, client):
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    scheduler_id = unique("s")
    fields = {"overlap": "skip", "catchUp": "latest", "catchUpWindow": "5000", "jitter": "250"}
    saved = operator.post("/ui/schedulers", data=form(operator, scheduler_id, **fields))
    assert saved.status_code == 303, saved.get_data(as_text=True)
    stored = client.get(f"/api/v1/schedulers/{scheduler_id}", headers=API).get_json()
    assert (stored["overlap"], stored["catchUp"], stored["catchUpWindow"], stored["jitter"]) == (
        "skip",
        "latest",
        5000,
        250,
    )
    page = operator.get(f"/ui/schedulers/{scheduler_id}", headers=PAGE).get_data(as_text=True)
    assert 'value="skip" selected' in page and 'value="latest" selected' in page
    assert 'name="jitter" value="250"' in page and 'id="pause-form"' in page
    listed = operator.get("/ui/schedulers", headers=PAGE).get_data(as_text=True)
    assert "skip · jitter 250 ms" in listed


def test_a_bad_policy_in_the_form_comes_back_with_the_apis_reason(app):
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    scheduler_id = unique("s")
    for fields, message in (({"jitter": "soon"}, "jitter"), ({"overlap": "queue"}, "overlap")):
        page = operator.post(
            "/ui/schedulers", data=form(operator, scheduler_id, **fields), headers=PAGE
        )
        assert page.status_code == 400 and message in page.get_data(as_text=True)


def test_pause_resume_and_run_now_from_the_page(app, client):
    operator = signed_in(app, TENANT, "olga", OPERATOR)
    scheduler_id = unique("s")
    operator.post("/ui/schedulers", data=form(operator, scheduler_id, overlap="skip"))
    url = f"/ui/schedulers/{scheduler_id}"
    token = csrf_token(operator)
    # Pause: the API shows it paused, the page offers resume
    paused = operator.post(f"{url}/pause", data={"csrf_token": token}, follow_redirects=True)
    assert flashes(paused) == [f"Scheduler {scheduler_id} paused."]
    assert client.get(f"/api/v1/schedulers/{scheduler_id}", headers=API).get_json()["paused"]
    assert 'id="resume-form"' in paused.get_data(as_text=True)
    # Run now, paused: a job; again while it is live: skipped
    ran = operator.post(f"{url}/trigger", data={"csrf_token": token}, follow_redirects=True)
    [said] = flashes(ran)
    assert said.startswith(f"Scheduler {scheduler_id} ran now: job repeat:")
    again = operator.post(f"{url}/trigger", data={"csrf_token": token}, follow_redirects=True)
    assert "did not run" in flashes(again)[0] and "overlap skip" in flashes(again)[0]
    # Resume
    resumed = operator.post(f"{url}/resume", data={"csrf_token": token}, follow_redirects=True)
    assert flashes(resumed) == [f"Scheduler {scheduler_id} resumed."]
    assert not client.get(f"/api/v1/schedulers/{scheduler_id}", headers=API).get_json()["paused"]
    # Another tenant's operator: 404, as in the API
    intruder = signed_in(app, unique("other"), "olga", OPERATOR)
    other_token = csrf_token(intruder)
    for action in ("pause", "resume", "trigger"):
        response = intruder.post(f"{url}/{action}", data={"csrf_token": other_token}, headers=PAGE)
        assert response.status_code == 404
