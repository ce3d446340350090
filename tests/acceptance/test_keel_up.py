"""``keel up`` on a machine with nothing configured: the README's walk-through, for real."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import requests

from tasks.config import read_env_file
from tasks.embedded import free_port
from tests.support.stack import wait_for
from web.stack import PROJECT_ROOT

KEEL = str(Path(sys.executable).with_name("keel"))


def clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KEEL_")}
    env.update(
        KEEL_HOME=str(home),
        KEEL_WEB_PORT=str(free_port()),
        KEEL_FLOWER_PORT=str(free_port()),
        KEEL_SANDBOX_PORT=str(free_port()),
    )
    return env


def start(env: dict[str, str], home: Path) -> subprocess.Popen:
    log = (home / "up.log").open("ab")
    process = subprocess.Popen(
        [KEEL, "up"], env=env, cwd=PROJECT_ROOT, stdout=log, stderr=subprocess.STDOUT
    )
    web = f"http://127.0.0.1:{env['KEEL_WEB_PORT']}"

    def healthy() -> bool:
        assert process.poll() is None, (home / "up.log").read_text()[-3000:]
        try:
            return requests.get(f"{web}/healthz", timeout=1).ok
        except requests.RequestException:
            return False

    wait_for(healthy, timeout=90, interval=0.3)
    return process


def stop(process: subprocess.Popen) -> list[psutil.Process]:
    tree = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=90) == 0
    return tree


def walk_through(env: dict[str, str], home: Path) -> str:
    stack_env = read_env_file(home / "env")
    token = subprocess.run(
        [KEEL, "token", "--tenant", "acme", "--user", "alice"],
        env={**env, "KEEL_HOME": str(home)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    web = stack_env["KEEL_WEB_URL"]
    accepted = requests.post(
        f"{web}/api/v1/reports", json={"reportId": "q3", "rows": 1000}, headers=headers, timeout=5
    )
    assert accepted.status_code == 202, accepted.text

    def completed() -> dict | None:
        job = requests.get(web + accepted.json()["statusUrl"], headers=headers, timeout=5).json()
        return job if job["state"] == "completed" else None

    job = wait_for(completed, timeout=60, interval=0.3)
    assert job["progress"]["percent"] == 100
    assert job["result"]["generatedRows"] == 1000
    return accepted.json()["statusUrl"]


def test_keel_up_runs_the_readme_walk_through_and_stops_cleanly(tmp_path):
    env = clean_env(tmp_path)
    process = start(env, tmp_path)
    try:
        stack_env = read_env_file(tmp_path / "env")
        assert {"KEEL_DATABASE_URL", "KEEL_REDIS_URL", "KEEL_SECRET_KEY", "KEEL_WEB_URL"} <= set(
            stack_env
        )
        status_url = walk_through(env, tmp_path)
        flower = f"http://127.0.0.1:{env['KEEL_FLOWER_PORT']}/api/workers"

        def flower_up() -> bool:
            try:
                auth = (stack_env["KEEL_FLOWER_USER"], stack_env["KEEL_FLOWER_PASSWORD"])
                return requests.get(flower, timeout=2, auth=auth).ok
            except requests.RequestException:
                return False

        wait_for(flower_up, timeout=30, interval=0.5)
    finally:
        tree = stop(process)
    # nothing it started outlives it, embedded Postgres included
    assert tree and not [p for p in tree if p.is_running() and p.status() != "zombie"]
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path / "pg") in " ".join(p.info["cmdline"] or [])
    ]

    # a second `keel up` finds the same data
    process = start(env, tmp_path)
    try:
        token = subprocess.run(
            [KEEL, "token", "--tenant", "acme", "--user", "alice"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        web = read_env_file(tmp_path / "env")["KEEL_WEB_URL"]
        again = requests.get(
            web + status_url, headers={"Authorization": f"Bearer {token}"}, timeout=5
        )
        assert again.status_code == 200 and again.json()["state"] == "completed"
    finally:
        stop(process)
