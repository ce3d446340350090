"""Separate hosts on one machine: Linux network namespaces on a private switch.

Each host is a network namespace with its own interfaces, addresses and
routes; processes run in it with ``ip netns exec``. The hosts are wired to a
switch that is itself a namespace holding two bridges, so that nothing is
added to the machine's own (root) namespace: no bridge, no veth, no address,
no route. Two networks, both in the benchmarking range 198.18.0.0/15 and
reachable only from inside the namespaces:

- ``lan`` (198.18.0.0/24): Postgres, the provider sandbox, HTTP;
- ``bus`` (198.18.1.0/24): Redis.

Each host has one port on each bridge. Cutting a host off is taking its
switch ports down (``ip link set ... down`` in the switch): the host keeps
its addresses and routes and simply stops hearing anything, as when a cable
is pulled. Cutting only its ``bus`` port parts it from Redis and leaves
Postgres reachable. There is no default route and no NAT: a host reaches the
other hosts and nothing else. IPv6 is off in every namespace, so no
link-local address appears either.

The test process itself stays in the root namespace; its clients (HTTP,
Postgres) run on threads that joined a host's namespace (``Inside``):
``setns`` changes the namespace of the calling thread only, and a socket
belongs to the namespace it was created in.

Names carry the pid of the run and a random part, so runs never collide; a
run that was killed (no teardown) is swept by the next one (``sweep_stale``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

NETS = {"lan": "198.18.0", "bus": "198.18.1"}  # /24 each, inside 198.18.0.0/15
PREFIX = "keelnet"
# A run's namespaces and folder: "<PREFIX>-<pid>-<random>-<host or folder suffix>".
RUN_RULE = re.compile(rf"^{PREFIX}-(\d+)-[0-9a-f]{{6}}-")
CLONE_NEWNET = 0x40000000
IP_TIMEOUT_S = 20
T = TypeVar("T")


class NetnsUnavailable(Exception):
    """This machine cannot build network namespaces for us (not root, or no ``ip netns``)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip ARGS``; a failure says which command failed and why."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here, or ``None`` when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    try:
        listed = subprocess.run(
            ["ip", "netns", "list"], capture_output=True, text=True, timeout=IP_TIMEOUT_S
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"`ip netns` is not available: {exc}"
    if listed.returncode != 0:
        return f"`ip netns` is not available: {listed.stderr.strip()}"
    return None


def _namespace_pids(netns: str) -> list[int]:
    listed = ip("netns", "pids", netns, check=False)
    return [int(pid) for pid in listed.stdout.split() if pid.isdigit()]


def remove_namespace(netns: str, grace_s: float = 5.0) -> None:
    """Kill whatever still runs in ``netns`` (TERM, then KILL), then delete it."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        pids = _namespace_pids(netns)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + grace_s
        while pids and _namespace_pids(netns) and time.monotonic() < deadline:
            time.sleep(0.1)
    ip("netns", "del", netns, check=False)


def sweep_stale() -> list[str]:
    """Remove what runs killed mid-way left: namespaces, what runs in them, folders."""
    swept = []
    for line in ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if _stale(name):
            remove_namespace(name)
            swept.append(name)
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}-*"):
        if _stale(folder.name) and folder.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
    return swept


def _stale(name: str) -> bool:
    """Whether ``name`` belongs to a run whose process is gone."""
    match = RUN_RULE.match(name)
    return match is not None and not _alive(int(match.group(1)))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Host:
    """One machine of the test network: a namespace with an address on each network."""

    name: str
    netns: str
    number: int

    def address(self, net: str = "lan") -> str:
        return f"{NETS[net]}.{self.number}"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run on this host."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclass
class Network:
    """A switch and the hosts plugged into it; ``build`` wires them, ``destroy`` removes all."""

    names: Sequence[str]
    run_id: str = field(default_factory=lambda: f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    created: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.run_id}-sw"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def build(self) -> Network:
        """Create the switch, then each host with one port on every network."""
        reason = unavailable_reason()
        if reason:
            raise NetnsUnavailable(reason)
        sweep_stale()
        self._namespace(self.switch)
        for net in NETS:
            ip("-n", self.switch, "link", "add", net, "type", "bridge")
            ip("-n", self.switch, "link", "set", net, "up")
        for number, name in enumerate(self.names, start=2):
            host = Host(name, f"{self.run_id}-{name}", number)
            self._namespace(host.netns)
            for net in NETS:
                port = self.port(host, net)
                cable = f"link add {port} type veth peer name {net} netns {host.netns}"
                ip("-n", self.switch, *cable.split())
                ip("-n", self.switch, "link", "set", port, "master", net, "up")
                ip("-n", host.netns, "addr", "add", f"{host.address(net)}/24", "dev", net)
                ip("-n", host.netns, "link", "set", net, "up")
            self.hosts[name] = host
        return self

    def _namespace(self, netns: str) -> None:
        ip("netns", "add", netns)
        self.created.append(netns)
        # Before any interface exists, so that none gets an IPv6 link-local address.
        subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                netns,
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
            check=True,
            capture_output=True,
            timeout=IP_TIMEOUT_S,
        )

    @staticmethod
    def port(host: Host, net: str) -> str:
        """The switch's end of ``host``'s cable on ``net`` (interface names: at most 15)."""
        return f"{host.name}-{net}"[:15]

    def cut(self, name: str, nets: Sequence[str] = tuple(NETS)) -> None:
        """Pull ``name``'s cables on ``nets``: its packets go nowhere until ``restore``."""
        for net in nets:
            ip("-n", self.switch, "link", "set", self.port(self[name], net), "down")

    def restore(self, name: str, nets: Sequence[str] = tuple(NETS)) -> None:
        for net in nets:
            ip("-n", self.switch, "link", "set", self.port(self[name], net), "up")

    def destroy(self) -> None:
        """Kill every process left in the hosts, delete them and the switch (veths go too)."""
        for netns in reversed(self.created):
            remove_namespace(netns)
        self.created.clear()


def _enter(netns: str) -> None:
    """Move the calling thread (only it) into ``netns``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns({netns}): {os.strerror(errno)}")
    finally:
        os.close(fd)


class Inside:
    """Threads that live in a host's namespace: what runs on them is a client on that host."""

    def __init__(self, host: Host, threads: int = 1) -> None:
        self.host = host
        self._pool = ThreadPoolExecutor(
            threads,
            thread_name_prefix=f"in-{host.name}",
            initializer=_enter,
            initargs=(host.netns,),
        )

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return self._pool.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        return self._pool.submit(fn, *args, **kwargs)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
