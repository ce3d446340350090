"""A Keel task's ``AsyncResult``: Celery's, but ``.get()`` follows the failure policies.

Celery's ``AsyncResult.get()`` (``follow_parents=True``) raises a parent's failure as soon
as it sees one: in Celery a failed parent means this task never runs, so there is nothing
to wait for. A Keel chord body or chain step whose ``on_child_failure`` is ``ignore`` or
``remove`` does run past a failed part or step (``tasks.jobs.end.chord_parts``,
``tasks.jobs.end.ending``): ``.get()`` on its result skips that parent, waits for the job
and returns its result, as the policy says. Every other parent is checked as Celery does
(a failed step before one that went on past its own parent still stops the chain's end).
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.result import AsyncResult, ResultSet

from tasks.jobs.observe import results


class KeelResult(AsyncResult):
    """``AsyncResult`` of a Keel task (``CeleryTask.AsyncResult``; signatures and canvas
    make theirs through it): Celery's, less the parent failures its job went on past."""

    _went_on: bool = False

    def _maybe_reraise_parent_error(self) -> None:
        links: list[tuple[Any, Any]] = []  # (a result, its parent), from this one up
        child, node = self, self.parent
        while node:
            links.append((child, node))
            child, node = node, node.parent
        for child, node in reversed(links):  # Celery's order: the first step first
            if isinstance(child, KeelResult) and _failed(node) and child.went_on_past_failure():
                continue
            node.maybe_throw()

    def went_on_past_failure(self) -> bool:
        """Whether this job runs although its parent failed (its failure policy)."""
        if not self._went_on:  # once it did, it does for good
            self._went_on = results.goes_on_past_failure(str(self.id))
        return self._went_on


def _failed(node: Any) -> bool:
    """What Celery's ``maybe_throw`` would raise for: a failed (or revoked) result, or a
    group with one."""
    if isinstance(node, ResultSet):
        return any(_failed(member) for member in node.results)
    return node.state in states.PROPAGATE_STATES
