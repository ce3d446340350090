"""``keel up`` owns its home: killed or cut off, it leaves nothing running and starts again.

One stack on one home lives through a ``kill -9`` of its supervisor, a
power cut (every process killed at once) and a graceful stop, and a job
finished before all that is still there at the end.
"""

from __future__ import annotations

import signal
import time
from contextlib import suppress

import psutil
import requests

from tests.acceptance.test_keel_up import run_report, user_token
from tests.support.keel_up import KeelUp, alive, command_line

GONE_WITHIN_S = 10


def test_kill_9_power_cut_and_graceful_stop_leave_nothing_running(tmp_path):
    up = KeelUp(tmp_path / "home").start()
    first = run_report(up, rows=20)

    # When `keel up` itself is killed with SIGKILL
    tree = up.tree()
    assert len(tree) > 10  # servers, worker pool, gunicorn workers, beat, Flower, sandbox
    up.process.kill()
    up.process.wait()
    # Then within 10 s no process of its stack is left
    started = time.monotonic()
    while alive(tree) and time.monotonic() - started < GONE_WITHIN_S:
        time.sleep(0.2)
    left = [(p.pid, " ".join(command_line(p))[:120]) for p in alive(tree)]
    assert not left, f"still running {time.monotonic() - started:.1f} s after kill -9: {left}"

    # Given a stack started again on the same home, then cut off: every process killed at once
    up.start()
    tree = up.tree()
    for process in tree:  # children may already be gone: their parent died first
        with suppress(psutil.NoSuchProcess):
            process.send_signal(signal.SIGKILL)
    up.process.wait()
    psutil.wait_procs(tree, timeout=GONE_WITHIN_S)
    # When `keel up` starts after the power cut (stale pid files, lock, AOF, WAL)
    up.start()
    # Then it serves: the earlier job is still there and new jobs complete
    again = requests.get(up.web + first["statusUrl"], headers=user_token(up), timeout=10)
    assert again.status_code == 200 and again.json()["state"] == "completed"
    run_report(up, rows=30)
    # And a graceful stop leaves nothing running, embedded Postgres included
    code, tree = up.stop(signal.SIGTERM)
    assert code == 0, up.log_tail()
    assert not alive(tree), [(p.pid, p.name()) for p in alive(tree)]
    pgdata = str(up.home / "pg")
    assert not [
        p for p in psutil.process_iter(["cmdline"]) if pgdata in " ".join(p.info["cmdline"] or [])
    ]
