"""A worker whose consumer is wedged fails its health check within 60 s; others do not.

Why: a frozen Redis used to leave a worker whose loop, timers and remote
control all ran while its consumer took nothing again (every prefetch slot
held by an ack Redis never answered). Its heartbeat ran on that loop, so
the health check said healthy and nothing restarted it. Now the heartbeat
says what the consumer looks like (``tasks.jobs.run.slots.ConsumerWatch``), and
``python -m tasks.jobs.upkeep.healthcheck worker`` fails once the consumer has
consumed nothing, though it should, for ``liveness.WEDGED_S`` (60 s).

Real worker processes, side by side on queues of their own, for one such
minute (``tests/support/wedge.py`` wedges them through Celery's remote control):

- ``slots``: every prefetch slot held by a delivery no request carries, the
  slots' own repair off (``KEEL_PREFETCH_ORPHAN_S=0``);
- ``poll``: a slot free, but its BRPOP never sent again, a job waiting;
- ``mends``: wedged like ``slots`` with the repair on (30 s): it gives the
  slots back and runs its job, and is never reported;
- ``idle``: nothing to do; ``busy``: its one slot running a long job, another waiting.
"""

from __future__ import annotations

import io
import socket
import subprocess
import sys
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from tasks import health
from tasks.jobs.intake.enqueue import add
from tasks.jobs.upkeep import healthcheck, liveness
from tests.support.chaos import add_reports
from tests.support.client import record, unique, wait_state
from tests.support.keel_up import KEEL
from tests.support.stack import WorkerProcess, wait_for

pytestmark = pytest.mark.stack

# Stated: reported once the consumer consumed nothing, though it should, for 60 s; the
# heartbeat that shows it comes within two beats (4 s) of that; this test looks every 0.5 s.
DETECT_WITHIN_S = liveness.WEDGED_S + 2 * liveness.HEARTBEAT_S + 2
KINDS = {
    "slots": {"KEEL_PREFETCH_ORPHAN_S": "0"},
    "poll": {},
    "mends": {},  # KEEL_PREFETCH_ORPHAN_S's default: 30 s
    "idle": {},
    "busy": {},
}


@pytest.fixture
def workers(stack):
    """One worker per kind (concurrency 1, a queue of its own), started side by side."""
    started = {
        kind: WorkerProcess(
            stack.home,
            unique(f"wedge-{kind}"),
            concurrency=1,
            queues=unique(f"wedge-{kind}"),
            extra_env={"KEEL_JOB_MODULES": "tests.support.wedge", **env},
        )
        for kind, env in KINDS.items()
    }
    failures: list[BaseException] = []

    def start(process: WorkerProcess) -> None:
        try:
            process.start()
        except BaseException as exc:
            failures.append(exc)

    try:
        side_by_side(start, started.values())
        assert not failures, failures
        yield started
    finally:
        side_by_side(lambda process: process.stop(timeout=20), started.values())


def side_by_side(action, processes) -> None:
    threads = [threading.Thread(target=action, args=(p,)) for p in processes]
    [t.start() for t in threads]
    [t.join() for t in threads]


def node(worker: WorkerProcess) -> str:
    return f"{worker.name}@{socket.gethostname()}"


def control(worker: WorkerProcess, command: str) -> object:
    from tasks.celery import app

    replies = app.control.broadcast(command, destination=[node(worker)], reply=True, timeout=10)
    assert replies, f"{worker.name} did not answer {command}"
    [(_, said)] = replies[0].items()
    assert "error" not in said, said
    return said["ok"]


def checked(worker: WorkerProcess) -> tuple[int, str]:
    """The health check's answer for ``worker``, in this process (as often as the test likes)."""
    out = io.StringIO()
    with redirect_stdout(out):
        code = healthcheck.main(["worker", worker.name])
    return code, out.getvalue()


def checked_as_deployed(worker: WorkerProcess) -> subprocess.CompletedProcess:
    check = [sys.executable, "-m", "tasks.jobs.upkeep.healthcheck", "worker", worker.name]
    return subprocess.run(check, capture_output=True, text=True, timeout=60)


def beats_with_its_consumer(worker: WorkerProcess) -> bool:
    return any(
        b["member"] == node(worker) and "consumer" in b for b in liveness.local_beats("worker")
    )


@pytest.mark.slow  # a minute of waiting for the wedge to count: a release check
def test_a_wedged_consumer_fails_the_health_check_within_60_s(stack, workers, tmp_path):
    slots, poll, mends, idle, busy = (workers[k] for k in KINDS)
    # Given five healthy workers, one of them busy with a long job, another job behind it
    for worker in workers.values():
        wait_for(lambda w=worker: beats_with_its_consumer(w), timeout=30)
    release = Path(tmp_path) / "release"
    held = add("test.hold", {"until": str(release), "maxMs": 150_000}, queue=busy.queues).job_id
    wait_state(held, "active", timeout=30)
    behind = add_reports(busy.queues, 1)
    as_deployed = checked_as_deployed(idle)
    assert as_deployed.returncode == 0, as_deployed.stdout + as_deployed.stderr
    assert f"worker: alive ({node(idle)})" in as_deployed.stdout
    # When three are wedged: every slot of `slots` and `mends` held by no request,
    # `poll` sending no BRPOP (one in flight is read first: a second later, it sends none)
    assert control(slots, "keel_test_hold_slots") == 1
    assert control(mends, "keel_test_hold_slots") == 1
    assert control(poll, "keel_test_stop_polling") == "stopped"
    wedged_at = time.monotonic()
    time.sleep(2.0)
    jobs = {kind: add_reports(workers[kind].queues, 1) for kind in ("slots", "poll", "mends")}
    waiting_at = time.monotonic()
    first_failed: dict[str, float] = {}
    said: dict[str, str] = {}
    mended_at = None
    while time.monotonic() - wedged_at < DETECT_WITHIN_S + 10:
        for kind, worker in workers.items():
            code, out = checked(worker)
            if code and kind not in first_failed:
                first_failed[kind], said[kind] = time.monotonic(), out
        if mended_at is None and all(
            (record(j) or {}).get("state") == "completed" for j in jobs["mends"]
        ):
            mended_at = time.monotonic()
        if {"slots", "poll"} <= first_failed.keys():
            break
        time.sleep(0.5)
    # Then the two wedged ones fail it, naming the wedge, 60 s after it began
    assert {"slots", "poll"} <= first_failed.keys(), (first_failed, said)
    slots_s, poll_s = first_failed["slots"] - wedged_at, first_failed["poll"] - waiting_at
    print(
        f"\nwedged consumers reported by the health check: every slot held {slots_s:.1f} s "
        f"after the wedge, poll lost {poll_s:.1f} s after a job waited (stated: "
        f"{liveness.WEDGED_S:.0f} s, seen within {DETECT_WITHIN_S - liveness.WEDGED_S:.0f} s "
        f"more); the self-mending worker ran its job "
        f"{(mended_at or float('nan')) - wedged_at:.1f} s after its wedge\n"
        f"{said['slots'].strip()}\n{said['poll'].strip()}"
    )
    # (their jobs did wait all along, and the busy worker's second one)
    waited = [*jobs["slots"], *jobs["poll"], *behind]
    assert {j: record(j)["state"] for j in waited} == dict.fromkeys(waited, "waiting")
    assert liveness.WEDGED_S - 1 <= slots_s <= DETECT_WITHIN_S, said["slots"]
    assert liveness.WEDGED_S - 1 <= poll_s <= DETECT_WITHIN_S, said["poll"]
    every_slot = "consumer wedged: every prefetch slot (1 of 1) held by messages no task"
    assert f"{node(slots)}: {every_slot}" in said["slots"], said["slots"]
    no_poll = "consumer wedged: a prefetch slot free and 1 message waiting in its queues"
    assert f"{node(poll)}: {no_poll}" in said["poll"], said["poll"]
    # as deployed too: exit 1, "consumer wedged: ... for N s"
    for worker in (slots, poll):
        deployed = checked_as_deployed(worker)
        assert deployed.returncode == 1, deployed.stdout + deployed.stderr
        assert "consumer wedged: " in deployed.stdout and " s (limit 60 s)" in deployed.stdout
    # And the system's status names them (from the heartbeats in Redis), `keel status` too
    [workers_check] = [c for c in health.system() if c.name == "workers"]
    assert not workers_check.ok and "wedged" in workers_check.found, workers_check
    assert f"{node(slots)}: consumer wedged: every prefetch slot" in workers_check.problem
    assert (
        f"{node(poll)}: consumer wedged: a prefetch slot free and 1 message"
        in workers_check.problem
    )
    status = subprocess.run([KEEL, "status"], capture_output=True, text=True, timeout=60)
    lines = [line for line in status.stdout.splitlines() if line.split()[1:2] == ["workers"]]
    assert status.returncode == 1 and lines and lines[0].startswith("FAIL"), status.stdout
    assert node(slots) in lines[0] and node(poll) in lines[0], lines
    # And the worker that gave its slots back (30 s) ran its job and was never reported;
    # nor were the idle one and the busy one, a minute long
    assert mended_at is not None and mended_at - wedged_at < 45, mended_at
    assert not {"mends", "idle", "busy"} & first_failed.keys(), said
    for worker in (mends, idle, busy):
        code, out = checked(worker)
        assert code == 0 and f"worker: alive ({node(worker)})" in out, out
    as_deployed = checked_as_deployed(idle)
    assert as_deployed.returncode == 0, as_deployed.stdout + as_deployed.stderr
    # And once the wedged consumers consume again, their jobs run and they are healthy
    assert control(slots, "keel_test_free_slots") == 1
    assert control(poll, "keel_test_poll_again") == "polling"
    for job_id in [*jobs["slots"], *jobs["poll"]]:
        wait_state(job_id, "completed", timeout=30)
    for worker in (slots, poll):
        wait_for(lambda w=worker: checked(w)[0] == 0, timeout=10)
    release.touch()
    for job_id in [held, *behind]:
        wait_state(job_id, "completed", timeout=30)
    assert all(w.process.poll() is None for w in workers.values())
