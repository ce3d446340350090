"""The dashboard's add-job page: the submittable types, a form drawn from a type's data
model, and a submission judged and added as ``POST /api/v1/jobs`` would.

``test.form_fields`` (``tests.support.jobs``) has a property of each kind the form draws:
a bounded string, a bounded integer, a number, a boolean, an enum and a list.
"""

from __future__ import annotations

import json
import re

import pytest

from tasks.jobs.observe.queries import get
from tasks.platform.config import reload_settings
from tests.support.client import bearer, unique
from tests.support.ui import PAGE, csrf_token, signed_in

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("addjob")
FORM_TYPE = "test.form_fields"


def inputs(page: str) -> dict[str, str]:
    """Each named input, select or text area of the page: its whole tag."""
    tags = re.findall(r"<(?:input|select|textarea)\b[^>]*>", page)
    return {re.search(r'name="([^"]+)"', tag).group(1): tag for tag in tags if "name=" in tag}


def attrs(tag: str) -> dict[str, str]:
    return dict(re.findall(r'(\w[\w-]*)="([^"]*)"', tag))


def offered_types(page: str) -> list[str]:
    select = re.search(r'<form method="get"[^>]*id="type-form".*?</select>', page, re.S)
    assert select, page
    return re.findall(r'<option value="([^"]+)"', select.group(0))


def filled(client, **values: str) -> dict[str, str]:
    form = {
        "csrf_token": csrf_token(client),
        "name": FORM_TYPE,
        "data.title": "weekly digest",
        "data.copies": "3",
        "data.ratio": "0.25",
        "data.urgent": "true",
        "data.color": "red",
        "data.tags": '["a", "b"]',
        "attempts": "2",
        "delay": "600",
    }
    form.update(values)
    return form


def test_the_page_offers_only_the_types_tenants_may_submit(app):
    alice = signed_in(app, TENANT, "alice")
    # The jobs page links to it
    assert 'href="/ui/jobs/new"' in alice.get("/ui/jobs", headers=PAGE).get_data(as_text=True)
    page = alice.get("/ui/jobs/new", headers=PAGE)
    assert page.status_code == 200
    offered = offered_types(page.get_data(as_text=True))
    assert {FORM_TYPE, "test.echo", "test.celery_logs"} <= set(offered)
    # Neither a type only the system may add, nor a tenant-schedulable but unsubmittable one
    assert "test.sleep" not in offered and "report.generate" not in offered
    assert offered == sorted(offered)


def test_a_types_form_is_drawn_from_its_data_schema(app):
    alice = signed_in(app, TENANT, "alice")
    page = alice.get(f"/ui/jobs/new?name={FORM_TYPE}", headers=PAGE).get_data(as_text=True)
    fields = inputs(page)
    title = attrs(fields["data.title"])
    assert (title["type"], title["minlength"], title["maxlength"]) == ("text", "2", "40")
    assert " required" in fields["data.title"]
    copies = attrs(fields["data.copies"])
    bounds = (copies["type"], copies["min"], copies["max"], copies["step"])
    assert bounds == ("number", "1", "5", "1")
    assert " required" in fields["data.copies"]
    ratio = attrs(fields["data.ratio"])
    assert (ratio["type"], ratio["step"], ratio["value"]) == ("number", "any", "0.5")
    assert " required" not in fields["data.ratio"]
    urgent = fields["data.urgent"]
    assert attrs(urgent)["type"] == "checkbox" and "checked" not in urgent
    assert fields["data.color"].startswith("<select")
    color = re.search(r'<select name="data.color".*?</select>', page, re.S).group(0)
    assert re.findall(r'<option value="([^"]*)"', color) == ["", "red", "green", "blue"]
    assert re.search(r'<option value="green"\s+selected>', color)
    assert fields["data.tags"].startswith("<textarea")
    # The required marks are on the two required properties only
    marked = re.findall(r'data-field="(\w+)">[^<]*<abbr class="required"', page)
    assert marked == ["title", "copies"]
    # And the bounded options
    assert attrs(fields["attempts"])["max"] == "100" and attrs(fields["delay"])["min"] == "0"


def test_a_type_without_a_model_and_a_celery_task_get_json_areas(app):
    alice = signed_in(app, TENANT, "alice")
    echo = inputs(alice.get("/ui/jobs/new?name=test.echo", headers=PAGE).get_data(as_text=True))
    assert echo["data"].startswith("<textarea") and not any(n.startswith("data.") for n in echo)
    celery = alice.get("/ui/jobs/new?name=test.celery_logs", headers=PAGE).get_data(as_text=True)
    assert {"args", "kwargs"} <= set(inputs(celery)) and "data" not in inputs(celery)
    # A type tenants may not submit has no form
    refused = alice.get("/ui/jobs/new?name=test.sleep", headers=PAGE)
    assert refused.status_code == 404 and 'id="job-form"' not in refused.get_data(as_text=True)


def test_a_submission_adds_the_users_job_and_opens_its_page(app):
    alice = signed_in(app, TENANT, "alice")
    # When alice fills the form and adds the job
    response = alice.post("/ui/jobs/new", data=filled(alice), headers=PAGE)
    # Then she is sent to the new job's page
    assert response.status_code == 303, response.get_data(as_text=True)
    job_id = response.headers["Location"].rsplit("/", 1)[1]
    assert response.headers["Location"].endswith(f"/ui/jobs/{job_id}")
    # And the job is hers, with the typed data and the options
    record = get(job_id)
    assert record is not None
    assert (record.tenant_id, record.user_id, record.name) == (TENANT, "alice", FORM_TYPE)
    assert record.data == {
        "title": "weekly digest",
        "copies": 3,
        "ratio": 0.25,
        "urgent": True,
        "color": "red",
        "tags": ["a", "b"],
    }
    assert record.opts["attempts"] == 2 and record.state == "delayed"
    page = alice.get(f"/ui/jobs/{job_id}", headers=PAGE)
    assert page.status_code == 200 and FORM_TYPE in page.get_data(as_text=True)
    # And the API shows it to her as her own job
    shown = app.test_client().get(
        f"/api/v1/jobs/{job_id}", headers=bearer(tenant=TENANT, user="alice")
    )
    assert shown.status_code == 200 and shown.get_json()["userId"] == "alice"


def test_an_unchecked_box_and_empty_optional_fields_take_the_defaults(app):
    alice = signed_in(app, TENANT, "alice")
    form = filled(alice, **{"data.ratio": "", "data.tags": "", "data.color": ""})
    del form["data.urgent"]
    response = alice.post("/ui/jobs/new", data=form, headers=PAGE)
    assert response.status_code == 303, response.get_data(as_text=True)
    record = get(response.headers["Location"].rsplit("/", 1)[1])
    assert record is not None and record.data == {
        "title": "weekly digest",
        "copies": 3,
        "urgent": False,
    }


def error_of(page: str) -> str:
    found = re.search(r'id="form-error">([^<]*)<', page)
    assert found, page
    return found.group(1)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"data.copies": "9"}, "copies: Input should be less than or equal to 5"),
        ({"data.copies": "three"}, "copies: &#39;three&#39; is not an integer"),
        ({"data.title": "x"}, "title: String should have at least 2 characters"),
        ({"data.tags": "[1"}, "data.tags is not valid JSON"),
        ({"attempts": "0"}, "opts.attempts"),
    ],
)
def test_a_refused_submission_comes_back_with_the_apis_message_and_the_values(app, values, message):
    alice = signed_in(app, TENANT, "alice")
    form = filled(alice, **values)
    response = alice.post("/ui/jobs/new", data=form, headers=PAGE)
    assert response.status_code == 400
    page = response.get_data(as_text=True)
    assert message in error_of(page)
    # The form is there again, with what she typed
    fields = inputs(page)
    typed = {k: v for k, v in form.items() if k not in ("csrf_token", "name", "data.color")}
    for name, value in typed.items():
        tag = fields[name]
        shown = tag if tag.startswith("<input") else page.split(tag, 1)[1].split("</textarea>")[0]
        assert value.replace('"', "&#34;") in shown, (name, tag)
    assert re.search(r'<option value="red"\s+selected>', page)


def test_the_api_message_for_an_unknown_type_names_the_field(app):
    alice = signed_in(app, TENANT, "alice")
    form = {"csrf_token": csrf_token(alice), "name": "test.sleep"}
    response = alice.post("/ui/jobs/new", data=form, headers=PAGE)
    assert response.status_code == 400
    assert "no job that tenants may submit is called" in error_of(response.get_data(as_text=True))


def test_a_tenant_at_its_quota_is_told_so_on_the_form(app, client, monkeypatch):
    tenant = unique("addjob-quota")
    monkeypatch.setenv("KEEL_TENANT_QUOTAS", json.dumps({"liveJobs": 1}))
    reload_settings()
    try:
        headers = bearer(tenant=tenant, user="alice")
        body = {"name": "test.echo", "opts": {"delay": 600_000}}
        assert client.post("/api/v1/jobs", json=body, headers=headers).status_code == 202
        alice = signed_in(app, tenant, "alice")
        response = alice.post("/ui/jobs/new", data=filled(alice), headers=PAGE)
        assert response.status_code == 429
        page = response.get_data(as_text=True)
        assert "live jobs" in error_of(page) and 'value="weekly digest"' in page
    finally:
        monkeypatch.undo()  # the quotas as they were, before the settings are read again
        reload_settings()
