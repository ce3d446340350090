"""One sandbox server's state: its store, its fault settings and its capacity.

Settings changed through the admin API are saved next to the data, so a
sandbox restarted in the middle of a test keeps failing and filling groups
the way the test asked.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from flask import current_app

from provider_sandbox import config
from provider_sandbox.faults import FaultInjector, Faults
from provider_sandbox.store import GroupStore

EXTENSION = "provider_sandbox"

default_capacity = config.capacity


@dataclass
class Sandbox:
    """Everything a request handler needs, shared by the server's threads."""

    store: GroupStore
    faults: FaultInjector
    default_capacity: int
    stopping: threading.Event

    @classmethod
    def open(cls, home: Path, capacity: int | None = None) -> Sandbox:
        store = GroupStore(home)
        stopping = threading.Event()
        saved = store.setting("faults")
        faults = FaultInjector(Faults.from_json(saved) if saved else Faults(), stopping)
        return cls(store, faults, capacity or default_capacity(), stopping)

    def capacity(self) -> int:
        return self.store.setting("capacity") or self.default_capacity

    def set_capacity(self, capacity: int) -> None:
        self.store.save_setting("capacity", capacity)

    def set_faults(self, faults: Faults) -> None:
        self.store.save_setting("faults", faults.to_json())
        self.faults.configure(faults)

    def reset(self) -> None:
        """Back to a fresh server: no data, no faults, the default capacity."""
        self.store.reset()
        self.faults.configure(Faults())

    def close(self) -> None:
        """Wake requests held by faults, then close the database."""
        self.stopping.set()
        self.store.close()


def current() -> Sandbox:
    return current_app.extensions[EXTENSION]
