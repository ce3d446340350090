"""A job's page shows its flow: a chord's parts and body, a chain's steps in order, a parent
and its children — each with its state and a link — and only the jobs the viewer may see.

The chord is sent on a queue no worker of this module consumes (its parts stay waiting,
one is cancelled); the chain runs on the module's inline worker.
"""

from __future__ import annotations

import re

import pytest
from celery import chain, chord

from tasks.jobs import JobOptions, Owner, acting_as, add
from tasks.jobs.end.cancel import cancel_many
from tasks.jobs.model.models import CANCELLABLE_STATES
from tasks.jobs.observe.queries import get
from tests.support.client import unique, wait_state
from tests.support.jobs import celery_add, celery_collect
from tests.support.ui import PAGE, signed_in

pytestmark = pytest.mark.usefixtures("stack")
TENANT = unique("flows")
OTHER = unique("flows-other")
QUIET = unique("flows-quiet")  # no worker consumes it
OPERATOR = ("operator",)
DAY_MS = 86_400_000


def section(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}">(.*?)</(?:ol|ul)>', page, re.S)
    assert found, f"no #{element_id} on the page"
    return found.group(1)


def nodes(page: str, element_id: str) -> list[tuple[str, str]]:
    """(job id, state) of each node of a flow's list, in the page's order."""
    items = re.findall(r'<li data-job-id="([^"]+)"(.*?)</li>', section(page, element_id), re.S)
    return [(job_id, _state(body)) for job_id, body in items]


def _state(body: str) -> str:
    badge = re.search(r'class="state state-([\w-]+)"', body)
    return badge.group(1) if badge else "none"


def links(page: str, element_id: str) -> set[str]:
    return set(re.findall(r'href="/ui/jobs/([^"]+)"', section(page, element_id)))


def later(owner: Owner, parent: str | None = None) -> str:
    """A job of ``owner`` due in a day (a child of ``parent``, if given)."""
    opts = JobOptions(delay=DAY_MS)
    return add("test.echo", {}, queue="default", opts=opts, owner=owner, parent=parent).job_id


def test_a_chords_body_shows_each_part_with_its_state(app):
    # Given alice's chord of three parts, the second cancelled
    with acting_as(Owner(TENANT, "alice")):
        parts = [celery_add.si(n, n).set(queue=QUIET) for n in range(3)]
        body = chord(parts)(celery_collect.s().set(queue=QUIET))
    part_ids = [part.id for part in body.parent.results]
    cancel_many([part_ids[1]], CANCELLABLE_STATES, by="test")
    alice = signed_in(app, TENANT, "alice")
    # When she opens the body's page
    page = alice.get(f"/ui/jobs/{body.id}", headers=PAGE).get_data(as_text=True)
    # Then the flow lists the parts in the header's order, each with its state and a link
    assert nodes(page, "flow-chord-parts") == [
        (part_ids[0], "waiting"),
        (part_ids[1], "cancelled"),
        (part_ids[2], "waiting"),
    ]
    assert links(page, "flow-chord-parts") == set(part_ids)
    body_state = str(get(body.id).state)
    [(shown_body, _)] = nodes(page, "flow-chord-body")
    assert shown_body == body.id and "(this job)" in section(page, "flow-chord-body")
    # And a part's page shows the same chord, with the body's state and a link to it
    part_page = alice.get(f"/ui/jobs/{part_ids[2]}", headers=PAGE).get_data(as_text=True)
    assert nodes(part_page, "flow-chord-body") == [(body.id, body_state)]
    assert links(part_page, "flow-chord-body") == {body.id}
    assert [job_id for job_id, _ in nodes(part_page, "flow-chord-parts")] == part_ids
    # But bob, of her tenant, sees no chord of hers at all
    bob = signed_in(app, TENANT, "bob")
    assert bob.get(f"/ui/jobs/{body.id}", headers=PAGE).status_code == 404


@pytest.mark.usefixtures("inline_worker")
def test_a_chains_steps_appear_in_order_on_each_steps_page(app):
    # Given alice's chain of three steps, run to its end
    with acting_as(Owner(TENANT, "alice")):
        last = chain(celery_add.si(1, 1), celery_add.s(10), celery_add.s(100)).apply_async()
    steps = [last.parent.parent.id, last.parent.id, last.id]
    wait_state(last.id, "completed")
    alice = signed_in(app, TENANT, "alice")
    for step in steps:
        # When she opens any step's page, the chain is there, in order, each completed
        page = alice.get(f"/ui/jobs/{step}", headers=PAGE).get_data(as_text=True)
        assert nodes(page, "flow-chain") == [(s, "completed") for s in steps], step
        assert links(page, "flow-chain") == set(steps) - {step}
        assert re.search(rf'data-job-id="{step}" aria-current="true"', page)


@pytest.mark.usefixtures("inline_worker")
def test_a_chord_that_ran_still_shows_its_parts_on_the_bodys_page(app):
    with acting_as(Owner(TENANT, "alice")):
        body = chord([celery_add.si(n, n) for n in range(3)])(celery_collect.s())
    part_ids = [part.id for part in body.parent.results]
    assert wait_state(body.id, "completed")["result"]["results"] == [0, 2, 4]
    alice = signed_in(app, TENANT, "alice")
    page = alice.get(f"/ui/jobs/{body.id}", headers=PAGE).get_data(as_text=True)
    assert nodes(page, "flow-chord-parts") == [(p, "completed") for p in part_ids]
    part_page = alice.get(f"/ui/jobs/{part_ids[1]}", headers=PAGE).get_data(as_text=True)
    assert nodes(part_page, "flow-chord-body") == [(body.id, "completed")]
    assert [job_id for job_id, _ in nodes(part_page, "flow-chord-parts")] == part_ids
    # Bob, of the same tenant, is refused the body's page; an operator sees the same flow
    assert signed_in(app, TENANT, "bob").get(f"/ui/jobs/{body.id}", headers=PAGE).status_code == 404
    olga = signed_in(app, TENANT, "olga", OPERATOR)
    shown = olga.get(f"/ui/jobs/{body.id}", headers=PAGE).get_data(as_text=True)
    assert [job_id for job_id, _ in nodes(shown, "flow-chord-parts")] == part_ids


def test_a_chains_steps_not_recorded_yet_are_shown_by_name(app):
    with acting_as(Owner(TENANT, "alice")):
        steps = celery_add.si(1, 1).set(queue=QUIET), celery_collect.s().set(queue=QUIET)
        last = chain(*steps).apply_async()
    first = last.parent.id
    page = signed_in(app, TENANT, "alice").get(f"/ui/jobs/{first}", headers=PAGE)
    shown = page.get_data(as_text=True)
    assert nodes(shown, "flow-chain") == [(first, "waiting"), (last.id, "none")]
    assert "test.celery_collect" in section(shown, "flow-chain")
    assert "not recorded yet" in section(shown, "flow-chain")


def test_children_show_to_their_owner_and_operators_never_across_tenants(app):
    # Given alice's parent with a child of hers, one of bob's, and one of another tenant's
    alice_owner = Owner(TENANT, "alice")
    parent = later(alice_owner)
    hers = later(alice_owner, parent)
    bobs = later(Owner(TENANT, "bob"), parent)
    foreign = later(Owner(OTHER, "alice"), parent)
    # Alice sees her own child only
    alice = signed_in(app, TENANT, "alice")
    page = alice.get(f"/ui/jobs/{parent}", headers=PAGE).get_data(as_text=True)
    assert nodes(page, "flow-children") == [(hers, "delayed")]
    assert bobs not in page and foreign not in page
    # An operator of the tenant sees both of its users' children, never the other tenant's
    olga = signed_in(app, TENANT, "olga", OPERATOR)
    page = olga.get(f"/ui/jobs/{parent}", headers=PAGE).get_data(as_text=True)
    assert nodes(page, "flow-children") == [(hers, "delayed"), (bobs, "delayed")]
    assert foreign not in page and OTHER not in page
    # And a child's page links back to its parent
    child = alice.get(f"/ui/jobs/{hers}", headers=PAGE).get_data(as_text=True)
    assert nodes(child, "flow-parent") == [(parent, "delayed")]
    # The other tenant's child does not show alice's parent to its own owner either
    theirs = signed_in(app, OTHER, "alice", OPERATOR)
    shown = theirs.get(f"/ui/jobs/{foreign}", headers=PAGE).get_data(as_text=True)
    assert 'id="flow"' not in shown and parent not in shown


def test_a_job_outside_any_flow_has_no_flow_section(app):
    job_id = later(Owner(TENANT, "alice"))
    page = signed_in(app, TENANT, "alice").get(f"/ui/jobs/{job_id}", headers=PAGE)
    assert page.status_code == 200 and 'id="flow"' not in page.get_data(as_text=True)
