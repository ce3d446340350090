"""A fresh ``keel up`` as a new user meets it: a quiet console, and a stack found from anywhere.

Uses the session's ``keel up`` (a fresh home, nothing configured), except the test of a
fresh start's log: other tests kill parts of the session's stack, and say so in its log.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.support.keel_up import KEEL, KeelUp
from tests.support.stack import wait_for


def keel_outside(up: KeelUp, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``keel ARGS`` from a folder outside the repository, without KEEL_HOME."""
    env = {k: v for k, v in up.env.items() if k != "KEEL_HOME"}
    return subprocess.run(
        [KEEL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def monitor_runs(up: KeelUp, cwd: Path) -> list[dict]:
    listed = keel_outside(up, cwd, "jobs", "list", "--name", "campaign.monitor", "--limit", "100")
    assert listed.returncode == 0, listed.stderr
    return [json.loads(line) for line in listed.stdout.splitlines()]


def test_a_second_terminal_elsewhere_finds_the_running_stack(keel_up: KeelUp, tmp_path):
    # When a token is asked for in a folder with no .keel, KEEL_HOME unset
    found = keel_outside(keel_up, tmp_path, "token", "--tenant", "acme", "--user", "alice")
    # Then it is the running stack's token, and stderr says which stack that is
    assert found.returncode == 0, found.stderr
    assert len(found.stdout.split()) == 1 and found.stdout.count(".") == 2
    pid = keel_up.process.pid if keel_up.process else None
    assert f"keel: using stack at {keel_up.home} (keel up pid {pid})" in found.stderr


def test_periodic_system_jobs_stay_out_of_the_console_and_the_default_jobs_page(
    keel_up: KeelUp, tmp_path
):
    # Given the stack has run campaign.monitor a few times (every 10 s)
    wait_for(lambda: len(monitor_runs(keel_up, tmp_path)) >= 3, timeout=60, interval=2)
    log = keel_up.log()
    # Then the console has no line about its routine runs: received, succeeded, fired
    assert not re.search(r"campaign\.monitor\[", log), log[-3000:]
    assert "(campaign.monitor)" not in log
    # And `keel jobs list` leaves it out by default, shows it with --all
    default = keel_outside(keel_up, tmp_path, "jobs", "list", "--limit", "100")
    everything = keel_outside(keel_up, tmp_path, "jobs", "list", "--all", "--limit", "100")
    assert default.returncode == 0 and everything.returncode == 0, default.stderr
    assert "campaign.monitor" not in default.stdout
    assert "campaign.monitor" in everything.stdout


@pytest.fixture(scope="module")
def fresh_up(tmp_path_factory):
    """A ``keel up`` of this module's own, nothing else has touched."""
    up = KeelUp(tmp_path_factory.mktemp("fresh-up") / "home").start()
    yield up
    up.stop(signal.SIGINT)


def test_a_fresh_keel_up_logs_no_warning_and_delivers_each_job_once(fresh_up: KeelUp, tmp_path):
    # Given the stack is up and its first periodic jobs have run
    wait_for(lambda: len(monitor_runs(fresh_up, tmp_path)) >= 2, timeout=60, interval=2)
    log = fresh_up.log()
    # Then no broker recovery ran on the fresh broker, and no delivery was a duplicate
    assert "broker epoch was missing" not in log
    warnings = [line for line in log.splitlines() if re.search(r"WARNING/|\bERROR/", line)]
    assert warnings == [], "\n".join(warnings)
    assert not re.search(r"\] ignored", log), log[-3000:]


# What `keel up` says while it starts (keel/stack.py), in this order, before "Keel is up."
PROGRESS = (
    "starting the stack in ",
    "starting Postgres in ",
    "starting Redis on port ",
    "migrating the database",
    "starting worker, beat",
)


def test_a_fresh_keel_up_says_what_it_starts_before_it_is_up(fresh_up: KeelUp):
    # Given a fresh stack, started with its embedded servers
    lines = fresh_up.log().splitlines()
    # Then each step of its start was said on a line of its own ("HH:MM:SS keel | ..."),
    # in order, and all of them before the announcement
    said = [n for n, line in enumerate(lines) if re.match(r"\d\d:\d\d:\d\d keel +\| ", line)]
    steps = [
        next((n for n in said if lines[n].split("| ", 1)[1].startswith(words)), None)
        for words in PROGRESS
    ]
    assert None not in steps and steps == sorted(steps), [lines[n] for n in said]
    assert steps[-1] < lines.index("Keel is up."), lines[: lines.index("Keel is up.")]


def test_a_stack_on_a_taken_port_stops_at_once_naming_it(keel_up: KeelUp, tmp_path):
    # Given a running stack, and a second home whose web port is the first's
    second = KeelUp(tmp_path / "home")
    taken = keel_up.env["KEEL_WEB_PORT"]
    env = {**second.env, "KEEL_WEB_PORT": taken}
    # When `keel up` starts there
    started = time.monotonic()
    refused = subprocess.run(
        [KEEL, "up"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    elapsed = time.monotonic() - started
    # Then it stops within the contract's 5 s (nothing was started), in one line naming the
    # port and the variable that moves it
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert elapsed < 5, elapsed
    [line] = refused.stderr.strip().splitlines()
    assert f"port {taken} is in use" in line and "KEEL_WEB_PORT=" in line
    assert "Keel is up" not in refused.stdout
    assert not (tmp_path / "home" / "pg").exists()


def test_two_stacks_each_answer_for_themselves(keel_up: KeelUp, fresh_up: KeelUp):
    # Given two stacks on one host, each on its own ports
    for up in (keel_up, fresh_up):
        # Then each one's API names that stack, and its sign-in link is its own dashboard's
        ready = requests.get(f"{up.web}/readyz", timeout=5)
        assert ready.headers["Keel-Stack"] == up.stack_env["KEEL_STACK_ID"]
        link = subprocess.run(
            [KEEL, "ui-link", "--tenant", "acme", "--user", "olga", "--role", "operator"],
            env=up.env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert link.startswith(f"{up.web}/ui/login/")
        browser = requests.Session()
        assert browser.get(link, allow_redirects=False, timeout=10).status_code == 303
        page = browser.get(f"{up.web}/ui/queues", headers={"Accept": "text/html"}, timeout=10)
        assert page.status_code == 200 and "Queues" in page.text
    assert keel_up.stack_env["KEEL_STACK_ID"] != fresh_up.stack_env["KEEL_STACK_ID"]
    assert keel_up.web != fresh_up.web
