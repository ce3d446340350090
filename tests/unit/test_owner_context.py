"""Whose jobs a block of code sends (``tasks.jobs.model.owner``): pure logic."""

from __future__ import annotations

import threading

from tasks.jobs.model.owner import Owner, acting, acting_as, current_owner, running, running_for

ACME, BETA = Owner("acme", "alice"), Owner("beta", "bob")


def test_acting_as_nests_and_restores():
    assert current_owner() is None
    with acting_as(ACME):
        assert current_owner() == ACME
        with acting_as(BETA):
            assert current_owner() == BETA
        assert current_owner() == ACME
    assert current_owner() is None


def test_a_running_jobs_owner_is_the_default_and_acting_as_still_decides():
    with running_for(ACME):
        assert (current_owner(), acting(), running()) == (ACME, None, ACME)
        with acting_as(BETA):
            assert current_owner() == BETA
        assert current_owner() == ACME
    assert running() is None


def test_the_owner_is_per_thread():
    seen = []
    with acting_as(ACME):
        thread = threading.Thread(target=lambda: seen.append(current_owner()))
        thread.start()
        thread.join()
    assert seen == [None]
