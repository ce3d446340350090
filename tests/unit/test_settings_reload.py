"""``reload_settings`` while other threads read the settings (a worker's threads in the
same process as a test, or a process that reloads on a signal): the settings in place
after it are the ones the environment now says, whatever the readers did meanwhile."""

from __future__ import annotations

import threading

from tasks.platform.config import get_settings, reload_settings


def test_readers_during_reloads_never_leave_old_settings_in_place(monkeypatch):
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            get_settings()

    readers = [threading.Thread(target=read, daemon=True) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        for n in range(40):
            monkeypatch.setenv("KEEL_WEBHOOK_ALLOW", "")
            assert reload_settings().webhook_allow == ""
            monkeypatch.setenv("KEEL_WEBHOOK_ALLOW", f"10.{n}.0.0/16")
            reload_settings()
            assert get_settings().webhook_allow == f"10.{n}.0.0/16", n
    finally:
        stop.set()
        for reader in readers:
            reader.join()
        monkeypatch.undo()
        reload_settings()
