"""``reload_settings`` while other threads read the settings (a worker's threads in the
same process as a test, or a process that reloads on a signal): the settings in place
after it are the ones the environment now says, whatever the readers did meanwhile."""

from __future__ import annotations

import threading

from tasks.platform import config
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


def test_reading_the_settings_may_ask_for_them_again(monkeypatch):
    # Given a settings source that, while read, asks for the settings (Django's settings
    # importing a project whose Celery app reads Keel's settings)
    real, calls = config.Settings, []

    def reentrant() -> config.Settings:
        calls.append(1)
        if len(calls) == 1:
            config.get_settings()
        return real()

    monkeypatch.setattr(config, "Settings", reentrant)
    config.forget_settings()
    found: list[config.Settings] = []
    try:
        reader = threading.Thread(target=lambda: found.append(config.get_settings()), daemon=True)
        reader.start()
        reader.join(30)
        # Then the read ends, with settings
        assert not reader.is_alive() and isinstance(found[0], real) and len(calls) == 2
    finally:
        monkeypatch.undo()
        reload_settings()
