"""``keel.install(app)`` on an app that set what Keel owns: Keel's values, one warning line per
setting it replaced, and no password in them (``tasks.assembly``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.support.stack import PROJECT_ROOT

APP_PASSWORD = "app-Secret-7f3a"
KEEL_PASSWORD = "keel-Secret-91cd"
KEEL_REDIS_URL = f"redis://:{KEEL_PASSWORD}@127.0.0.1:6390/0"

# A process of its own: one Keel app per process, and this one's is Keel's. Its log lines
# are plain (Keel's own log format, which also redacts, is not set up by install).
INSTALL = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
from celery import Celery
import keel

app = Celery("p")
app.conf.worker_prefetch_multiplier = 4
app.conf.result_backend = sys.argv[1]
keel.install(app)
conf = app.conf
print(json.dumps({key: conf[key] for key in sys.argv[2:]}))
"""


def install_in_a_process(result_backend: str, *keys: str) -> tuple[dict, list[str]]:
    """The installed app's ``keys``, and the lines ``install`` logged."""
    env = {**os.environ, "KEEL_REDIS_URL": KEEL_REDIS_URL, "KEEL_BUILTIN_JOBS": "none"}
    done = subprocess.run(
        [sys.executable, "-c", INSTALL, result_backend, *keys],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr.splitlines()


def test_install_replaces_what_keel_owns_and_names_each_without_a_password():
    app_backend = f"redis://:{APP_PASSWORD}@cache.internal:6379/3"
    keys = ("worker_prefetch_multiplier", "result_backend", "task_acks_late")
    conf, lines = install_in_a_process(app_backend, *keys)

    assert conf == {
        "worker_prefetch_multiplier": 1,
        "result_backend": f"tasks.jobs.calls.result_backend:KeelBackend+{KEEL_REDIS_URL}",
        "task_acks_late": True,  # (not set by the app: no line for it)
    }
    replaced = {
        line.split("Keel sets ", 1)[1].split("=", 1)[0]: line
        for line in lines
        if "Keel sets " in line
    }
    assert sorted(replaced) == ["result_backend", "worker_prefetch_multiplier"], lines
    assert replaced["worker_prefetch_multiplier"].startswith(
        "WARNING Keel sets worker_prefetch_multiplier=1 on the Celery app 'p' (it had 4): "
    ), replaced
    backend_line = replaced["result_backend"]
    assert "(it had 'redis://:***@cache.internal:6379/3')" in backend_line, backend_line
    assert "KeelBackend+redis://:***@127.0.0.1:6390/0" in backend_line, backend_line
    output = "\n".join(lines)
    assert APP_PASSWORD not in output and KEEL_PASSWORD not in output, output
