"""The platform role changes the limits every tenant shares from the dashboard: a queue's
limits on the queues page, a job type's key limit overrides on the key limits page. Each
change goes through the API's functions: read back from ``live_limits`` /
``live_key_limits``, shown on the page, audited with the platform user and the reason. Bad
input is a 400 naming the field, and stores nothing; a tenant's operator is 403 and changes
nothing. (In Chromium: ``tests/browser/test_platform_limit_forms.py``; the same change held
by running workers: ``tests/integration/test_live_limits.py``, through the API.)"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from keel.cli import main
from tasks.jobs.observe import platform_views
from tasks.jobs.run import live_key_limits, live_limits
from tests.support.client import unique
from tests.support.ui import PAGE, csrf_token, signed_in, signed_in_platform

pytestmark = pytest.mark.usefixtures("stack")
OPERATOR = ("operator",)
REASON = "partner incident: slow their queue down tonight"
KEYED = "test.keyed"  # KeyConcurrency("customer"): max_running only, no rate


def post(session, path: str, form: dict[str, str], csrf: bool = True):
    data = {"csrf_token": csrf_token(session), **form} if csrf else form
    return session.post(path, data=data, headers=PAGE)


def flashes(text: str) -> list[str]:
    return re.findall(r'class="flash (\w+)" role="\w+">([^<]*)<', text)


def card(text: str, attribute: str) -> str:
    return text[text.index(attribute) :].split("</section>")[0]


def field_errors(text: str) -> set[str]:
    return set(re.findall(r'data-error-for="([^"]+)"', text))


def test_a_platform_user_sets_and_clears_a_queues_limits_from_the_form(app):
    user, queue = unique("root"), unique("q")
    root = signed_in_platform(app, user)
    # When the platform user sets the queue's concurrency and rate from the queues page
    form = {"queue": queue, "concurrency": "2", "rate.max": "5", "rate.durationMs": "1000"}
    answer = post(root, "/ui/queue-limits", {**form, "reason": REASON})
    assert answer.status_code == 303 and answer.headers["Location"].endswith("/ui/queues")
    # Then they are in force, as every worker reads them
    assert live_limits.effective(queue).concurrency == 2
    assert live_limits.of(queue).effective.rate.max == 5
    # And the page says so, with who set them and why
    text = root.get("/ui/queues", headers=PAGE).get_data(as_text=True)
    assert (
        "ok",
        f"Queue {queue}: 2 at once · 5 starts per 1000 ms in force on every worker "
        "within a second.",
    ) in flashes(text)
    shown = card(text, f'data-queue="{queue}"')
    assert 'data-limits-source="live"' in shown
    assert '<span class="in-force">2 at once · 5 starts per 1000 ms</span>' in shown
    assert f'data-field="setBy">ui:{user}<' in shown and REASON in shown
    # And the change is audited as the API's and the CLI's are: who, why, before and after
    [change] = live_limits.history(queue)
    assert (change.actor, change.reason, change.before) == (f"ui:{user}", REASON, None)
    assert change.after == {"concurrency": 2, "rate": {"max": 5, "duration_ms": 1000}}
    printed = CliRunner().invoke(main, ["queues", "limits", "show", queue])
    assert printed.exit_code == 0, printed.output
    audit = json.loads(printed.output.splitlines()[1])
    assert (audit["actor"], audit["reason"]) == (f"ui:{user}", REASON)
    # And the form, like every view of a platform session, is kept in platform_views
    assert ("ui.set_queue_limits", "/ui/queue-limits") in {
        (v.view, v.path) for v in platform_views.newest(user, 10)
    }
    # When it clears them, the default (none) is in force again, audited too
    cleared = post(root, "/ui/queue-limits/clear", {"queue": queue, "reason": REASON})
    assert cleared.status_code == 303
    assert live_limits.effective(queue) is None and live_limits.of(queue).override is None
    newest = live_limits.history(queue)[0]
    assert (newest.actor, newest.after) == (f"ui:{user}", None)
    text = root.get("/ui/queues", headers=PAGE).get_data(as_text=True)
    assert (
        "ok",
        f"Queue {queue}: limits set live cleared; its default (no limit) is in force.",
    ) in flashes(text)
    # And clearing what is not there says so, and records nothing
    post(root, "/ui/queue-limits/clear", {"queue": queue, "reason": REASON})
    text = root.get("/ui/queues", headers=PAGE).get_data(as_text=True)
    assert ("error", f"Queue {queue} had no limits set live: nothing cleared.") in flashes(text)
    assert len(live_limits.history(queue)) == 2


def test_a_platform_user_lifts_a_queues_concurrency_with_none(app):
    queue = unique("q")
    root = signed_in_platform(app, unique("root"))
    post(root, "/ui/queue-limits", {"queue": queue, "concurrency": "none", "reason": REASON})
    try:
        assert live_limits.of(queue).override.limits == {"concurrency": None}
    finally:
        live_limits.clear_limits(queue, "cli:test", REASON)


def test_a_platform_user_sets_and_clears_a_key_override_from_the_form(app):
    user, tenant = unique("root"), unique("partner")
    root = signed_in_platform(app, user)
    form = {"name": KEYED, "tenant": tenant, "key": "vip-*", "maxRunning": "3"}
    # When the platform user sets an override for one tenant's vip keys
    answer = post(root, "/ui/key-limits", {**form, "reason": REASON})
    assert answer.status_code == 303 and answer.headers["Location"].endswith("/ui/key-limits")
    # Then it holds for that tenant's matching keys, as a worker reads it, and no other's
    declared, _ = live_key_limits.declared_of(KEYED)
    assert live_key_limits.concurrency(KEYED, tenant, "vip-1", declared).max_running == 3
    other = live_key_limits.concurrency(KEYED, unique("other"), "vip-1", declared)
    assert other.max_running == declared.max_running
    in_force = live_key_limits.in_force(live_key_limits.of(KEYED), tenant, "vip-1")
    assert in_force["maxRunningFrom"] == {"tenant": tenant, "key": "vip-*"}
    # And the page shows it, with who set it and why, and says what was done
    text = root.get("/ui/key-limits", headers=PAGE).get_data(as_text=True)
    assert ("ok", f"{KEYED}, {tenant}, key vip-*: 3 at once, in force within a second.") in (
        flashes(text)
    )
    row = text[text.index(f'data-tenant="{tenant}"') :].split("</tr>")[0]
    assert "3 at once" in row and f'data-field="setBy">ui:{user}<' in row and REASON in row
    # And the change is audited with the platform user and the reason
    change = next(c for c in live_key_limits.history(KEYED) if c.tenant == tenant)
    assert (change.actor, change.reason, change.key) == (f"ui:{user}", REASON, "vip-*")
    assert change.after == {"max_running": 3}
    # When it clears it from its row, the declaration holds again
    cleared = post(
        root,
        "/ui/key-limits/clear",
        {"name": KEYED, "tenant": tenant, "key": "vip-*", "reason": REASON},
    )
    assert cleared.status_code == 303
    assert live_key_limits.concurrency(KEYED, tenant, "vip-1", declared) == declared
    newest = next(c for c in live_key_limits.history(KEYED) if c.tenant == tenant)
    assert (newest.actor, newest.after) == (f"ui:{user}", None)
    text = root.get("/ui/key-limits", headers=PAGE).get_data(as_text=True)
    assert f'data-tenant="{tenant}"' not in text.split('id="key-limit-changes"')[0]


QUEUE_REFUSALS = [
    ({"concurrency": "0"}, "concurrency"),
    ({"concurrency": "many"}, "concurrency"),
    ({"concurrency": "1.5"}, "concurrency"),
    ({"rate.max": "5"}, "rate.durationMs"),
    ({"rate.durationMs": "1000"}, "rate.max"),
    ({}, "concurrency"),  # nothing to set
    ({"concurrency": "2", "reason": ""}, "reason"),
    ({"concurrency": "2", "reason": "too short"}, "reason"),
    ({"concurrency": "2", "reason": "no\x00NUL in a reason"}, "reason"),
]


@pytest.mark.parametrize("form,field", QUEUE_REFUSALS, ids=[f for _, f in QUEUE_REFUSALS])
def test_a_refused_queue_limit_is_a_400_naming_the_field_and_stores_nothing(app, form, field):
    queue = unique("q")
    root = signed_in_platform(app, unique("root"))
    answer = post(root, "/ui/queue-limits", {"queue": queue, "reason": REASON, **form})
    assert answer.status_code == 400
    text = answer.get_data(as_text=True)
    # The field's reason is next to it, in the queue's own form, with the values as typed
    shown = card(text, f'data-queue="{queue}"')
    assert field in field_errors(shown) and 'id="form-error"' in text
    for name, value in form.items():
        if value and "\x00" not in value:
            assert f'name="{name}" ' in shown and f'value="{value}"' in shown
    assert live_limits.of(queue).override is None and live_limits.history(queue) == []


def test_a_queue_name_the_api_would_refuse_is_a_400_naming_it(app):
    root = signed_in_platform(app, unique("root"))
    answer = post(root, "/ui/queue-limits", {"queue": "a/b", "concurrency": "1", "reason": REASON})
    assert answer.status_code == 400 and "queue: a queue" in answer.get_data(as_text=True)
    assert live_limits.history("a/b") == []


KEY_REFUSALS = [
    ({"name": "no.such.job"}, "name"),
    ({"name": "test.echo"}, "name"),  # a job type that declares no key limit
    ({"maxRunning": "0"}, "maxRunning"),
    ({"maxRunning": "lots"}, "maxRunning"),
    ({"maxRunning": "", "rate.max": "5"}, "rate.durationMs"),
    ({"maxRunning": "", "rate.max": "5", "rate.durationMs": "1000"}, "rate"),  # not declared
    ({"maxRunning": ""}, "maxRunning"),  # nothing to set
    ({"key": ""}, "key"),
    ({"key": "x" * 101}, "key"),
    ({"tenant": "a\x07b"}, "tenant"),
    ({"reason": ""}, "reason"),
    ({"reason": "too short"}, "reason"),
]


@pytest.mark.parametrize("form,field", KEY_REFUSALS, ids=[f for _, f in KEY_REFUSALS])
def test_a_refused_key_override_is_a_400_naming_the_field_and_stores_nothing(app, form, field):
    tenant = unique("partner")
    root = signed_in_platform(app, unique("root"))
    sent = {"name": KEYED, "tenant": tenant, "key": "vip-*", "maxRunning": "2", "reason": REASON}
    answer = post(root, "/ui/key-limits", {**sent, **form})
    assert answer.status_code == 400
    text = answer.get_data(as_text=True)
    errors = text[text.index('id="set-key-limit"') :].split("</form>")[0]
    assert field in field_errors(errors) and 'id="form-error"' in text
    name = form.get("name", KEYED)
    assert [c for c in live_key_limits.history(name, 500) if c.tenant == tenant] == []


def test_a_tenant_operator_never_sees_the_forms_and_is_403_on_each(app):
    queue, tenant = unique("q"), unique("acme")
    olga = signed_in(app, tenant, "olga", OPERATOR)
    # The operator's queues page has no limit form, and the key limits page is refused
    page = olga.get("/ui/queues", headers=PAGE).get_data(as_text=True)
    assert "set-queue-limits" not in page and "/ui/queue-limits" not in page
    assert olga.get("/ui/key-limits", headers=PAGE).status_code == 403
    # And every form sent anyway is refused, and nothing changes
    forms = {
        "/ui/queue-limits": {"queue": queue, "concurrency": "1", "reason": REASON},
        "/ui/queue-limits/clear": {"queue": queue, "reason": REASON},
        "/ui/key-limits": {
            "name": KEYED,
            "tenant": tenant,
            "key": "k",
            "maxRunning": "1",
            "reason": REASON,
        },
        "/ui/key-limits/clear": {"name": KEYED, "tenant": tenant, "key": "k", "reason": REASON},
    }
    for path, form in forms.items():
        answer = post(olga, path, form)
        assert answer.status_code == 403, path
        assert "platform role" in answer.get_data(as_text=True)
    assert live_limits.history(queue) == []
    assert [c for c in live_key_limits.history(KEYED, 500) if c.tenant == tenant] == []


def test_a_form_without_its_csrf_token_is_refused_and_changes_nothing(app):
    queue, tenant = unique("q"), unique("partner")
    root = signed_in_platform(app, unique("root"))
    answer = post(
        root, "/ui/queue-limits", {"queue": queue, "concurrency": "1", "reason": REASON}, False
    )
    assert answer.status_code == 400 and "csrf" in answer.get_data(as_text=True).lower()
    key = {"name": KEYED, "tenant": tenant, "key": "k", "maxRunning": "1", "reason": REASON}
    assert post(root, "/ui/key-limits", key, csrf=False).status_code == 400
    assert live_limits.history(queue) == []
    assert [c for c in live_key_limits.history(KEYED, 500) if c.tenant == tenant] == []


def test_the_platform_role_still_acts_on_no_tenants_queue(app):
    root = signed_in_platform(app, unique("root"))
    page = root.get("/ui/queues", headers=PAGE).get_data(as_text=True)
    assert "set-queue-limits" in page and "pause-form" not in page
    answer = post(root, "/ui/queues/reports/pause", {})
    assert answer.status_code == 403 and "acts on none" in answer.get_data(as_text=True)
