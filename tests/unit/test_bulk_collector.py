"""The cyclic collector's pause around a bulk add's batch (``tasks.jobs.intake.bulk``)."""

from __future__ import annotations

import gc
import os
import threading

import pytest

from tasks.jobs.intake import bulk


@pytest.fixture(autouse=True)
def collector_on():
    gc.enable()
    yield
    gc.enable()


def test_the_collector_is_off_during_the_batch_and_on_after():
    with bulk._collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_overlapping_batches_leave_it_on_only_when_the_last_ends():
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def first() -> None:
        with bulk._collector_paused():
            first_in.set()
            second_in.wait(5)
        first_out.set()

    thread = threading.Thread(target=first)
    thread.start()
    first_in.wait(5)
    with bulk._collector_paused():
        second_in.set()
        first_out.wait(5)
        seen["after the first ended"] = gc.isenabled()
    thread.join()
    assert seen == {"after the first ended": False} and gc.isenabled()


def test_a_collector_the_caller_turned_off_stays_off():
    gc.disable()
    with bulk._collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_child_forked_during_a_batch_has_it_on():
    read, write = os.pipe()
    with bulk._collector_paused():
        pid = os.fork()
        if pid == 0:
            try:
                os.write(write, b"on" if gc.isenabled() else b"off")
            finally:
                os._exit(0)
    os.close(write)
    said = os.read(read, 10)
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert said == b"on"
