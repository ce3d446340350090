"""The embedded Postgres: ``pgserver``'s binaries, with the postmaster as our child.

pgserver starts Postgres through ``pg_ctl``, which detaches it: nobody is
told when it dies, it outlives a killed ``keel up``, and pgserver's list of
handles (``.handle_pids.json``) keeps the pids of crashed processes, after
which no later stop ever stops the server. So Keel uses pgserver for the
binaries and ``initdb`` only, and runs ``postgres`` itself: the postmaster is
a direct child (tied to us with ``lifeline``), a crash shows up as its exit,
and a stop is a signal and a wait.

Postgres refuses to run as root. As root, its programs run in a user
namespace of their own (``unshare --user``, util-linux) where root is seen as
pgserver's ``pgserver`` account: Postgres is content, while to the kernel the
process is still root without any of root's privileges, so the cluster's files
belong to root and a data folder or venv inside a private folder (``/root``,
``mktemp -d``) is reached as its owner reaches it. No folder's mode is ever
changed. Where user namespaces are refused (some container runtimes), the
programs run as the ``pgserver`` account itself, as pgserver does; a folder on
the way that this account cannot enter is then named in a one-line refusal.
"""

from __future__ import annotations

import fcntl
import functools
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import psutil

from keel.embedded.private import open_private_log, private_dir
from keel.errors import StartRefused
from tasks.platform.lifeline import stop_process, tied_to_parent

SERVER_USER = "pgserver"
HANDLE_FILE = ".handle_pids.json"  # pgserver's; meaningless once we own the postmaster
# SIGINT: "fast" shutdown (clients cut off, clean checkpoint); then "immediate"; then kill.
STOP_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL)


def _pgserver():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs complains about XDG_RUNTIME_DIR
        from pgserver import _commands, postgres_server, utils
    return _commands, postgres_server, utils


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


@functools.cache
def user_namespaces(uid: int, gid: int) -> bool:
    """Whether root may run a program in a user namespace that maps ``uid`` to itself."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False
    try:
        probe = subprocess.run(
            [unshare, "--user", f"--map-user={uid}", f"--map-group={gid}", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


@dataclass(frozen=True)
class ServerLaunch:
    """How Postgres's programs start, so that they run as a user Postgres accepts.

    ``prefix`` goes before the program (the user namespace); ``account`` is the
    user switched to when there is no namespace (its uid then owns the data).
    ``who`` names, for a refusal, the identity that must reach the files.
    """

    prefix: tuple[str, ...] = ()
    account: pwd.struct_passwd | None = None
    who: str = ""
    uid: int = 0
    gid: int = 0

    def argv(self, program: Path, *args: str) -> list[str]:
        return [*self.prefix, str(program), *args]

    def popen_kwargs(self) -> dict:
        """``subprocess`` arguments that switch to ``account`` (its group, no others)."""
        if self.account is None:
            return {}
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def refuse_unreachable(self, path: Path, what: str) -> None:
        """``StartRefused`` naming the first folder on the way to ``path`` it cannot enter."""
        if not self.who:
            return
        closed = closed_folder(path, self.uid, self.gid)
        if closed is None:
            return
        info = closed.stat()
        raise StartRefused(
            f"the embedded Postgres runs {self.who}, which cannot enter {closed} "
            f"(mode {stat.S_IMODE(info.st_mode):04o}, owner uid {info.st_uid}) to reach its "
            f"{what} {path}: put the checkout and KEEL_HOME under a folder it can enter, "
            "or set KEEL_DATABASE_URL to a Postgres of yours"
        )


def server_launch() -> ServerLaunch:
    """Ourselves; as root, a user namespace (else pgserver's account, see the module)."""
    if os.geteuid() != 0:
        return ServerLaunch()
    account = system_account(SERVER_USER)
    uid, gid = account.pw_uid, account.pw_gid
    if user_namespaces(uid, gid):
        return ServerLaunch(
            prefix=("unshare", "--user", f"--map-user={uid}", f"--map-group={gid}"),
            who="in a user namespace (as root without root's privileges)",
        )
    return ServerLaunch(account=account, who=f"as the {SERVER_USER} account", uid=uid, gid=gid)


def closed_folder(path: Path, uid: int, gid: int) -> Path | None:
    """The outermost folder on the way to ``path`` that ``uid``/``gid`` may not search.

    Only folders that exist are asked (the rest will be made by Keel, open to it).
    """
    for folder in reversed([path, *path.parents]):
        try:
            info = folder.stat()
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(info.st_mode):
            continue
        if info.st_uid == uid:
            bit = stat.S_IXUSR
        elif info.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not info.st_mode & bit:
            return folder
    return None


def _hand_over(pgdata: Path, uid: int, gid: int) -> None:
    """Make ``pgdata`` belong to the user that runs Postgres now, if it is someone else's.

    A cluster made as root by an earlier release belongs to the ``pgserver`` account;
    run in a user namespace it must belong to root (and the other way round).
    """
    info = pgdata.stat()
    if info.st_uid == uid and info.st_gid == gid:
        return
    os.chown(pgdata, uid, gid)
    for folder, names, files in os.walk(pgdata):
        for name in (*names, *files):
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


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
        launch = server_launch()
        launch.refuse_unreachable(commands.POSTGRES_BIN_PATH, "programs in")
        launch.refuse_unreachable(self.pgdata, "data folder")
        self._prepare(commands.POSTGRES_BIN_PATH, launch)
        self.socket_dir = utils.find_suitable_socket_dir(
            self.pgdata, postgres_server.PostgresServer.runtime_path
        )
        if launch.account is not None and self.socket_dir != self.pgdata:
            os.chown(self.socket_dir, launch.account.pw_uid, launch.account.pw_gid)
        # No TCP listener; the socket is for our user only (the default is 0777).
        args = launch.argv(
            commands.POSTGRES_BIN_PATH / "postgres",
            "-D",
            str(self.pgdata),
            "-k",
            str(self.socket_dir),
            "-c",
            "listen_addresses=",
            "-c",
            "unix_socket_permissions=0700",
            *(arg for name, value in self.settings.items() for arg in ("-c", f"{name}={value}")),
        )
        with os.fdopen(open_private_log(self.pgdata / "log"), "ab") as log:
            self.process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=tied_to_parent(signal.SIGINT),
                **launch.popen_kwargs(),
            )
        self._wait_ready(timeout_s)
        return self.url

    def _prepare(self, bin_path: Path, launch: ServerLaunch) -> None:
        private_dir(self.pgdata)
        if os.geteuid() == 0:
            owner = launch.account.pw_uid if launch.account is not None else 0
            group = launch.account.pw_gid if launch.account is not None else 0
            _hand_over(self.pgdata, owner, group)
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(bin_path, launch)
        (self.pgdata / HANDLE_FILE).unlink(missing_ok=True)
        self._clear_stale_postmaster()

    def _initdb(self, bin_path: Path, launch: ServerLaunch) -> None:
        argv = launch.argv(
            bin_path / "initdb",
            "-D",
            str(self.pgdata),
            "--auth=trust",
            "--auth-local=trust",
            "--encoding=utf8",
            "-U",
            "postgres",
        )
        with tempfile.TemporaryFile("w+") as output:  # a pipe can hang initdb's children
            done = subprocess.run(
                argv, stdout=output, stderr=subprocess.STDOUT, text=True, **launch.popen_kwargs()
            )
            if done.returncode != 0:
                output.seek(0)
                raise RuntimeError(f"initdb failed in {self.pgdata}:\n{output.read()[-2000:]}")

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
