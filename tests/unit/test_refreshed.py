"""``Refreshed``: a value read again once it is old, kept when a read fails."""

from __future__ import annotations

import threading

from tasks.platform.refreshed import Refreshed


class Store:
    def __init__(self) -> None:
        self.value, self.reads, self.down = 1, 0, False

    def read(self) -> int:
        self.reads += 1
        if self.down:
            raise ConnectionError("the store does not answer")
        return self.value


def test_a_value_is_read_once_per_interval_and_again_when_forgotten():
    store = Store()
    held = Refreshed(store.read, 0, 60, "a number")
    assert [held.get() for _ in range(5)] == [1] * 5 and store.reads == 1
    store.value = 2
    assert held.get() == 1  # not a minute old yet
    held.forget()
    assert held.get() == 2 and store.reads == 2
    always_old = Refreshed(store.read, 0, 0, "a number")
    store.value = 3
    assert always_old.get() == 3 and always_old.get() == 3 and store.reads == 4


def test_a_failed_read_keeps_the_last_value_and_is_not_tried_again_at_once():
    store = Store()
    held = Refreshed(store.read, 0, 60, "a number")
    store.down = True
    assert held.get() == 0 and held.get() == 0 and store.reads == 1  # the empty value
    store.down = False
    held.forget()
    assert held.get() == 1
    store.down, store.value = True, 2
    held.forget()
    assert held.get() == 1 and held.get() == 1 and store.reads == 3
    store.down = False
    held.forget()
    assert held.get() == 2


def test_while_one_caller_reads_again_the_others_get_the_copy_there_is():
    store, reading, release = Store(), threading.Event(), threading.Event()

    def slow_read() -> int:
        if store.reads:  # the first read answers at once, the next ones wait to be released
            reading.set()
            release.wait(10)
        return store.read()

    held = Refreshed(slow_read, 0, 60, "a number")
    assert held.get() == 1
    store.value = 2
    held.forget()
    rereading = threading.Thread(target=held.get)
    rereading.start()
    assert reading.wait(10)
    assert held.get() == 1  # not held up by the read under way
    release.set()
    rereading.join(10)
    assert held.get() == 2
