"""``JobOptions.columns``: what a record keeps of a job's options, default ones included."""

from __future__ import annotations

from tasks.jobs.model.options import JobOptions


def test_untouched_options_are_kept_as_the_model_dumps_them():
    opts, extra = JobOptions().columns()
    assert (opts, extra) == (JobOptions().stored(), None)
    opts["attempts"] = 9  # each call's dict is its own: a caller may change it
    assert JobOptions().columns()[0]["attempts"] == 1


def test_options_given_or_changed_later_are_kept_as_given():
    changed = JobOptions()
    changed.attempts = 3
    assert changed.columns()[0]["attempts"] == 3
    timed = JobOptions(timeout=2000)
    assert timed.columns() == ({"attempts": 1, "delay": 0}, {"timeout": 2000})
