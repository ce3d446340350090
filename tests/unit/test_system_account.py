"""The embedded Postgres's system account, asked for by several processes at once.

On a machine that has never run Keel as root, the suite's two xdist workers each start a
cluster and both found the account missing: one ``useradd`` failed, and every module of
that worker errored in setup (reproduced 3 times in 3 with the account deleted first).
"""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from concurrent.futures import ProcessPoolExecutor

import pytest

from keel.embedded.postgres_server import system_account


def _uid(name: str) -> int:
    return system_account(name).pw_uid


@pytest.mark.skipif(os.geteuid() != 0, reason="creates a system user: root only")
def test_processes_asking_at_once_all_get_the_one_new_account():
    name = f"keel-t{uuid.uuid4().hex[:8]}"
    try:
        with ProcessPoolExecutor(max_workers=6) as pool:
            uids = list(pool.map(_uid, [name] * 12))
        assert set(uids) == {pwd.getpwnam(name).pw_uid}
    finally:
        subprocess.run(["userdel", name], check=False, capture_output=True)
