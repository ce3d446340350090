"""Delivery tags (``tasks.platform.transport``): unique per message, across threads and forked
children.

A tag keys kombu's unacked copy of a message in Redis: two messages sharing one
would restore or remove each other's copy.
"""

from __future__ import annotations

import os
import threading

from tasks.platform import transport


def test_tags_are_unique_across_threads():
    tags: list[list[str]] = [[] for _ in range(4)]

    def draw(into: list[str]) -> None:
        into.extend(transport._tags.next() for _ in range(20_000))

    threads = [threading.Thread(target=draw, args=(into,)) for into in tags]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    drawn = [tag for into in tags for tag in into]
    assert len(drawn) == 80_000 == len(set(drawn))


def test_a_forked_child_draws_its_own_prefix():
    """A child that counts from the parent's prefix would repeat the parent's next tags."""
    parent = transport._tags.next()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its first tag, then out without running the parent's cleanup
        try:
            os.write(write, transport._tags.next().encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.close(read)
    assert os.waitpid(pid, 0)[1] == 0
    assert child.count(".") == 1 and child.rsplit(".", 1)[1] == "0"  # its count starts anew
    after = transport._tags.next()
    assert child.rsplit(".", 1)[0] != parent.rsplit(".", 1)[0]
    assert after.rsplit(".", 1)[0] == parent.rsplit(".", 1)[0]
    assert int(after.rsplit(".", 1)[1]) == int(parent.rsplit(".", 1)[1]) + 1
    assert child != after
