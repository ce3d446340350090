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

from celery.result import AsyncResult

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
            # The parent's state is read once, by Celery's own check: read apart from it, a
            # parent failing between the two reads was raised without asking the policy.
            try:
                node.maybe_throw()
            except Exception:
                if isinstance(child, KeelResult) and child.went_on_past_failure():
                    continue  # recorded with the parent's end: seen failed, it is there
                raise

    def went_on_past_failure(self) -> bool:
        """Whether this job runs although its parent failed (its failure policy)."""
        if not self._went_on:  # once it did, it does for good
            self._went_on = results.goes_on_past_failure(str(self.id))
        return self._went_on
