"""The supervisor's restart rule and the home lock, without a stack."""

from __future__ import annotations

import os

import pytest

from keel.home import HomeBusy, HomeLock
from keel.supervisor import RestartPolicy


def test_restarts_back_off_then_give_up_when_a_unit_keeps_dying():
    policy = RestartPolicy(delays_s=(1, 2, 4, 8, 16), stable_after_s=60)
    delays = [policy.after_exit(ran_for_s=0.5) for _ in range(6)]
    assert delays == [1, 2, 4, 8, 16, None]


def test_a_unit_that_ran_for_a_while_starts_a_fresh_series():
    policy = RestartPolicy(delays_s=(1, 2, 4), stable_after_s=60)
    assert [policy.after_exit(1), policy.after_exit(1), policy.after_exit(1)] == [1, 2, 4]
    assert policy.after_exit(ran_for_s=61) == 1
    assert policy.after_exit(ran_for_s=2) == 2


def test_a_second_lock_on_a_home_is_refused_naming_the_owner(tmp_path):
    home = tmp_path / "home"
    first = HomeLock(home).acquire()
    written = (home / "lock").read_bytes()
    assert written == f"{os.getpid()}\n".encode()
    with pytest.raises(HomeBusy, match=f"pid {os.getpid()}"):
        HomeLock(home).acquire()
    assert (home / "lock").read_bytes() == written  # the refusal changed nothing
    first.release()
    HomeLock(home).acquire().release()


def test_the_home_and_its_lock_are_private_from_the_first_byte(tmp_path):
    previous = os.umask(0o022)  # a permissive umask: the modes must not depend on it
    try:
        lock = HomeLock(tmp_path / "home").acquire()
    finally:
        os.umask(previous)
    assert (tmp_path / "home").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "home" / "lock").stat().st_mode & 0o777 == 0o600
    lock.release()


def test_readiness_refuses_an_api_that_is_not_this_stacks(tmp_path):
    # Given another program answering 200 on the port the stack's web app should have
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from keel.stack import Stack

    class Other(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Other)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        stack = Stack(home=tmp_path)
        stack.env = {
            "KEEL_WEB_URL": f"http://127.0.0.1:{server.server_port}",
            "KEEL_STACK_ID": "ours",
        }
        # When the stack asks whether its API is ready
        problem = stack._readiness()
    finally:
        server.shutdown()
    # Then the answer does not count: it is another server's
    assert problem is not None and "another server" in problem
