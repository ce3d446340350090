"""A job's flow as one viewer may see it: its parent and children, its chain's steps, and the
chord it is the body or a part of (the dashboard's "Flow" on a job's page).

What links the parts is what the records keep:

- parent and children: ``jobs.parent_job_id`` (``job.add_child``);
- a chain: a step's Celery context keeps the steps still to come, last first
  (``chain``, each a signature whose ``task_id`` Celery froze, else
  ``<step id>.next``: ``tasks.jobs.end.canvas``), and a recorded step the id of the
  step before it (``parent_id``). The steps before a job are found by walking
  ``parent_id`` back while that step's next one is this one; the steps after it are read
  from the first step's context, so steps not recorded yet are shown by name;
- a chord: the body's context keeps its parts' ids in the header's order
  (``chordParts``; a part that stands for another job: ``chordBound``), and a part's the
  body's id (``chord``: ``tasks.jobs.store.canvas.chord_body_id``). Once the body runs,
  its claim takes its delivery's context and ``chordParts`` is gone: its parts are then
  the jobs of its group (``group``) that name it as their body, recorded around it.

Only records the viewer may see are shown (``tasks.jobs.store.flows``): a user's own
jobs, an operator's tenant's. A chain's step not recorded (or not the viewer's) is shown
by the name the viewer's own record gives it, with no state and no link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from tasks.jobs.model.models import JobRecord
from tasks.jobs.model.owner import Owner
from tasks.jobs.store import flows as store
from tasks.jobs.store.canvas import chord_body_id
from tasks.jobs.store.flows import FlowRecord, Viewer
from tasks.platform.db import transaction

MAX_NODES = 100  # children or chord parts shown; the rest are counted
MAX_STEPS = 100  # steps of a chain walked back from a job


@dataclass(frozen=True)
class FlowNode:
    """One job of a flow: ``state`` None when the viewer has no record of it (not yet)."""

    id: str
    name: str
    state: str | None
    current: bool = False


@dataclass(frozen=True)
class Flow:
    """The parts of a job's flow that apply to it (empty lists and ``None`` for the rest)."""

    parent: FlowNode | None = None
    children: list[FlowNode] = field(default_factory=list)
    children_total: int = 0
    chain: list[FlowNode] = field(default_factory=list)
    chord_body: FlowNode | None = None
    chord_parts: list[FlowNode] = field(default_factory=list)
    chord_parts_total: int = 0

    @property
    def empty(self) -> bool:
        return not (self.parent or self.children or self.chain or self.chord_body)


def flow_of(job: JobRecord, owner: Owner, *, tenant_wide: bool = False) -> Flow:
    """``job``'s flow as ``owner`` may see it (``tenant_wide``: an operator's view)."""
    viewer = Viewer(owner.tenant_id, None if tenant_wide else owner.user_id)
    ctx = job.celery_ctx or {}
    this = FlowRecord(job.id, job.name, str(job.state), job.parent_job_id, ctx, job.created_at)
    with transaction() as session:
        parent = None
        if job.parent_job_id:
            found = store.visible(session, [job.parent_job_id], viewer).get(job.parent_job_id)
            parent = _node(found, job.id) if found else None
        children, children_total = store.children(session, job.id, viewer, MAX_NODES)
        body, parts, parts_total = _chord(session, this, viewer)
        return Flow(
            parent=parent,
            children=[_node(child, job.id) for child in children],
            children_total=children_total,
            chain=_chain(session, this, viewer),
            chord_body=body,
            chord_parts=parts,
            chord_parts_total=parts_total,
        )


def _node(record: FlowRecord, current_id: str) -> FlowNode:
    return FlowNode(record.id, record.name, record.state, record.id == current_id)


def _next_step(step: FlowRecord) -> tuple[str, str] | None:
    """The id and name of the step after ``step``, if it is a chain's step with one to come."""
    chain = step.celery_ctx.get("chain")
    if not isinstance(chain, list) or not chain or not isinstance(chain[-1], dict):
        return None
    signature = chain[-1]
    task_id = (signature.get("options") or {}).get("task_id")
    return str(task_id or f"{step.id}.next"), str(signature.get("task") or "?")


def _first_step(session: Session, step: FlowRecord, viewer: Viewer) -> FlowRecord:
    """The chain's first step the viewer may see, walking back from ``step``."""
    for _ in range(MAX_STEPS):
        before_id = step.celery_ctx.get("parent_id")
        if not isinstance(before_id, str):
            break
        before = store.visible(session, [before_id], viewer).get(before_id)
        following = _next_step(before) if before is not None else None
        if before is None or following is None or following[0] != step.id:
            break
        step = before
    return step


def _chain(session: Session, job: FlowRecord, viewer: Viewer) -> list[FlowNode]:
    """The chain's steps in order, when ``job`` is one of two or more."""
    first = _first_step(session, job, viewer)
    steps = [(first.id, first.name)]
    for signature in reversed(first.celery_ctx.get("chain") or []):
        if not isinstance(signature, dict):
            break
        task_id = (signature.get("options") or {}).get("task_id")
        steps.append((str(task_id or f"{steps[-1][0]}.next"), str(signature.get("task") or "?")))
    if len(steps) < 2:
        return []
    records = store.visible(session, [step_id for step_id, _ in steps], viewer)
    return [
        _node(records[step_id], job.id)
        if step_id in records
        else FlowNode(step_id, name, None, step_id == job.id)
        for step_id, name in steps
    ]


def _chord(
    session: Session, job: FlowRecord, viewer: Viewer
) -> tuple[FlowNode | None, list[FlowNode], int]:
    """The chord's body and its parts in the header's order, when ``job`` is either."""
    ctx = job.celery_ctx
    body: FlowRecord | None = None
    if "chordParts" in ctx or _ran_as_body(ctx):
        body = job
    elif body_id := chord_body_id(ctx):
        body = store.visible(session, [body_id], viewer).get(body_id)
    if body is None:
        return None, [], 0
    part_ids = body.celery_ctx.get("chordParts")
    if not isinstance(part_ids, list):  # the body ran (its claim took the delivery's context)
        group_id = body.celery_ctx.get("group") or ctx.get("group")
        if not isinstance(group_id, str):
            return None, [], 0
        found, total = store.chord_parts(session, body, group_id, viewer, MAX_NODES)
        if not found:
            return None, [], 0
        return _node(body, job.id), [_node(part, job.id) for part in found], total
    bound = body.celery_ctx.get("chordBound") or {}
    part_ids = [str(bound.get(part, part)) for part in part_ids]
    shown = part_ids[:MAX_NODES]
    records = store.visible(session, shown, viewer)
    parts = [_node(records[part_id], job.id) for part_id in shown if part_id in records]
    return _node(body, job.id), parts, len(part_ids)


def _ran_as_body(ctx: dict[str, Any]) -> bool:
    """Whether a context may be a chord body's after its run: of a group, yet no part of it."""
    return isinstance(ctx.get("group"), str) and "group_index" not in ctx and "chord" not in ctx
