"""The embedded Postgres: ``pgserver``'s binaries, with the postmaster as our child.

pgserver starts Postgres through ``pg_ctl``, which detaches it: nobody is
told when it dies, it outlives a killed ``keel up``, and pgserver's list of
handles (``.handle_pids.json``) keeps the pids of crashed processes, after
which no later stop ever stops the server. So Keel uses pgserver for the
binaries and ``initdb`` only, and runs ``postgres`` itself: the postmaster is
a direct child (tied to us with ``lifeline``), a crash shows up as its exit,
and a stop is a signal and a wait.

Postgres refuses to run as root; as root the cluster belongs to pgserver's
``pgserver`` system user, as it did under pgserver.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from pathlib import Path

import psutil

from keel.embedded.lifeline import stop_process, tied_to_parent
from keel.embedded.private import open_private_log, private_dir

SERVER_USER = "pgserver"
HANDLE_FILE = ".handle_pids.json"  # pgserver's; meaningless once we own the postmaster
# SIGINT: "fast" shutdown (clients cut off, clean checkpoint); then "immediate"; then kill.
STOP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL)


def _pgserver():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
        from pgserver import _commands, postgres_server, utils
    return _commands, postgres_server, utils


def _server_account() -> pwd.struct_passwd | None:
    """Who runs Postgres: us, or pgserver's system user when we are root."""
    if os.geteuid() != 0:
        return None
    return system_account(SERVER_USER)


def system_account(name: str) -> pwd.struct_passwd:
    """The system user ``name``, created (``useradd``, as pgserver does) if it is missing.

    Several processes may ask at once on a machine that has never run Keel as root (the
    test suite's xdist workers each start a cluster; two ``keel up`` stacks): ``useradd``
    then fails in all but one, with "user already exists" or "cannot lock /etc/passwd".
    So the creation is serialized by a lock file, and the account is looked up again
    under the lock before ``useradd`` runs.
    """
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    with open(Path(tempfile.gettempdir()) / f"keel-useradd-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-s", "/bin/bash", name], check=True, capture_output=True)
        return pwd.getpwnam(name)


def _run_as(account: pwd.struct_passwd | None) -> dict:
    """``subprocess`` arguments that run a command as ``account`` (its group, no others)."""
    if account is None:
        return {}
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _let_traverse(path: Path) -> None:
    """Let another user reach ``path``: search (x) only, on the folders that lack it."""
    for folder in [path, *path.parents]:
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            folder.chmod(mode | stat.S_IXOTH)


class EmbeddedPostgres:
    """A private Postgres cluster in ``home/pg``, reached over its unix socket."""

    name = "postgres"

    def __init__(self, home: Path, settings: dict[str, str] | None = None) -> None:
        self.pgdata = home / "pg"
        self.settings = dict(settings or {})  # more ``-c name=value`` for the postmaster
        self.socket_dir: Path | None = None
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres:@/postgres?host={self.socket_dir}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, timeout_s: float = 120) -> str:
        """Start the postmaster (initdb first if needed); returns its URL once it accepts."""
        commands, postgres_server, utils = _pgserver()
        account = _server_account()
        self._prepare(commands, account)
        self.socket_dir = utils.find_suitable_socket_dir(
            self.pgdata, postgres_server.PostgresServer.runtime_path
        )
        if account is not None and self.socket_dir != self.pgdata:
            os.chown(self.socket_dir, account.pw_uid, account.pw_gid)
        # No TCP listener; the socket is for our user only (the default is 0777).
        args = [
            str(commands.POSTGRES_BIN_PATH / "postgres"),
            "-D",
            str(self.pgdata),
            "-k",
            str(self.socket_dir),
            "-c",
            "listen_addresses=",
            "-c",
            "unix_socket_permissions=0700",
            *(arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")),
        ]
        with os.fdopen(open_private_log(self.pgdata / "log"), "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=tied_to_parent(signal.SIGINT),
                **_run_as(account),
            )
        self._wait_ready(timeout_s)
        return self.url

    def _prepare(self, commands, account: pwd.struct_passwd | None) -> None:
        private_dir(self.pgdata)
        if account is not None:
            os.chown(self.pgdata, account.pw_uid, account.pw_gid)
            _let_traverse(self.pgdata.parent)
        if not (self.pgdata / "PG_VERSION").exists():
            commands.initdb(
                ["--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"],
                pgdata=self.pgdata,
                **_run_as(account),
            )
        (self.pgdata / HANDLE_FILE).unlink(missing_ok=True)
        self._clear_stale_postmaster()

    def _clear_stale_postmaster(self) -> None:
        """Stop a postmaster left running on our data, or forget one that is gone.

        Whoever calls this owns the data folder (``keel up`` holds the home's
        lock), so a live postmaster here is an orphan of an earlier crash. A
        pid file naming some other process (pids are reused after a reboot)
        would make Postgres refuse to start: it is removed.
        """
        pidfile = self.pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().split()[0])
            process = psutil.Process(pid)
            ours = process.name() == "postgres" and str(self.pgdata) in process.cmdline()
        except (FileNotFoundError, IndexError, ValueError, psutil.Error):
            ours = False
            process = None
        if not ours:
            pidfile.unlink(missing_ok=True)
            return
        for signum in STOP_SIGNALS:
            process.send_signal(signum)
            try:
                process.wait(timeout=30 if signum == signal.SIGINT else 5)
                return
            except psutil.TimeoutExpired:
                continue

    def _wait_ready(self, timeout_s: float) -> None:
        """Until ``postmaster.pid`` says ``ready`` (crash recovery may come first)."""
        pidfile = self.pgdata / "postmaster.pid"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                break
            try:
                lines = pidfile.read_text().splitlines()
            except FileNotFoundError:
                lines = []
            ready = len(lines) >= 8 and lines[7].strip() == "ready"
            if ready and lines[0].strip() == str(self.pid):
                return
            time.sleep(0.05)
        tail = (self.pgdata / "log").read_text(errors="replace")[-2000:]
        self.stop()
        raise RuntimeError(f"embedded postgres did not start in {self.pgdata}:\n{tail}")

    def poll(self) -> int | None:
        """The exit code once the postmaster has died, else ``None``."""
        return self.process.poll() if self.process is not None else None

    def stop(self) -> None:
        """Fast shutdown; escalates to immediate shutdown and a kill if it hangs."""
        if self.process is None:
            return
        stop_process(self.process, STOP_SIGNALS, timeout_s=30)
        self.process = None
