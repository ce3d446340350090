"""``Held``: items held back to go out together, in order."""

from __future__ import annotations

import threading

from tasks.platform.holding import Held


def test_a_caller_takes_what_is_held_oldest_first():
    sent: list[list[str]] = []
    held: Held[str] = Held(sent.append, lambda: 60, "test-held")
    assert held.take() == []
    held.add("waiting")
    held.add("active")
    assert held.take() == ["waiting", "active"] and held.take() == []
    held.add("progress")
    held.flush()
    assert sent == [["progress"]] and held.take() == []


def test_a_caller_s_send_waits_for_the_held_items_the_thread_is_sending():
    # Given a held "active" that the thread has taken and is sending (a slow round trip)
    sent: list[list[str]] = []
    sending, release = threading.Event(), threading.Event()

    def slow_send(batch: list[str]) -> None:
        sending.set()
        release.wait(10)
        sent.append(batch)

    held: Held[str] = Held(slow_send, lambda: 60, "test-held")
    held.add("active")
    flusher = threading.Thread(target=held.flush)
    flusher.start()
    assert sending.wait(10)
    # When a caller takes what is held, to send its "completed" after it
    taken: list[list[str]] = []
    caller = threading.Thread(
        target=lambda: (taken.append(held.take()), sent.append(["completed"]))
    )
    caller.start()
    # Then it waits until the thread's send is done: "active" goes out first
    caller.join(0.3)
    assert caller.is_alive() and sent == []
    release.set()
    flusher.join(10)
    caller.join(10)
    assert sent == [["active"], ["completed"]] and taken == [[]]


def test_a_send_that_fails_is_logged_and_what_is_held_later_still_goes(caplog):
    calls: list[list[str]] = []

    def send(batch: list[str]) -> None:
        calls.append(batch)
        if len(calls) == 1:
            raise ConnectionError("Redis went away")

    held: Held[str] = Held(send, lambda: 60, "test-held")
    held.add("lost")
    held.flush()
    assert "held items not sent" in caplog.text
    held.add("next")
    held.flush()
    assert calls == [["lost"], ["next"]]
