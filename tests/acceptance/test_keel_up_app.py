"""``keel up --app proj.celery:app``: a project's own Celery app on the embedded stack.

Started in the project's folder (examples/plain_celery), the stack's worker and beat run
the project's app (``celery -A proj.celery:app``), and the project's own process sends its
unchanged tasks there: ``AsyncResult.get()`` returns what the stack's worker computed.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.keel_up import KeelUp, clean_env
from tests.support.stack import PROJECT_ROOT

PROJECT = PROJECT_ROOT / "examples" / "plain_celery"

SEND = """
import json
from proj.tasks import add, resize
sent = [add.delay(20, 22), resize.delay("dog.png")]
print(json.dumps([result.get(timeout=90) for result in sent]))
"""


def test_keel_up_runs_a_projects_own_celery_app(tmp_path):
    home = tmp_path / "home"
    env = {**clean_env(home), "KEEL_BUILTIN_JOBS": "none"}
    up = KeelUp(home, env=env, args=("--app", "proj.celery:app"), cwd=PROJECT).start()
    try:
        assert up.stack_env["KEEL_CELERY_APP"] == "proj.celery:app"
        # The project's own process, on the stack's servers (its env file)
        client_env = {**env, **up.stack_env, "PYTHONPATH": str(PROJECT)}
        done = subprocess.run(
            [sys.executable, "-c", SEND],
            cwd=PROJECT,
            env=client_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stderr[-3000:] + up.log_tail()
        assert json.loads(done.stdout.strip().splitlines()[-1]) == [42, {"resized": "dog.png"}]
        # The stack's worker ran the project's app, and consumed its routed queue
        log = up.log()
        assert "proj.celery:app" in log or "app:         proj" in log, up.log_tail()
        assert "proj.tasks.add" in log, up.log_tail()
    finally:
        up.stop()
