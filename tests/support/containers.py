"""Containers for the ``container`` tier (tests/container): a private Docker daemon,
a debootstrapped base image and stand-ins for the official Postgres and Redis images.

No container registry is reachable here, so nothing is pulled: the base image is
made with ``debootstrap`` (Debian bookworm, whose ``python3`` is 3.11; its tarball is
cached under ``$KEEL_CONTAINER_CACHE``, ``/var/cache/keel-test`` by default, for a
month), and ``postgres:16`` / ``redis:7`` are stood in for by Debian's
``postgresql-15`` and ``redis-server`` with small entrypoints honouring the same
variables (and ``rabbitmq:3-management`` by ``rabbitmq-server``, for the
``rabbitmq`` profile). Packages come from Debian's apt and PyPI, through the host's network.

The daemon is the test's own: its data root, exec root and socket live in a temporary
folder, and ``stop()`` removes its containers, networks and the ``docker0`` bridge it
created, then the folder.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from tests.support import kept_logs

# Debian's docker.io CLI (with the daemon of the same version) and docker-compose 1.29.
DOCKER = "/usr/bin/docker"
COMPOSE = "/usr/bin/docker-compose"
APT_PACKAGES = "docker.io docker-compose debootstrap"

CACHE = Path(os.environ.get("KEEL_CONTAINER_CACHE", "/var/cache/keel-test"))
BASE_IMAGE = "keel-test/debian-python:bookworm"
POSTGRES_IMAGE = "keel-test/postgres:16"
REDIS_IMAGE = "keel-test/redis:7"
RABBITMQ_IMAGE = "keel-test/rabbitmq:3-management"


def missing() -> str | None:
    """Why this machine cannot run the tier (None: it can)."""
    if os.geteuid() != 0:
        return "the container tier starts its own dockerd and needs root"
    tools = [DOCKER, COMPOSE, shutil.which("dockerd"), shutil.which("debootstrap")]
    if not all(tool and os.access(tool, os.X_OK) for tool in tools):
        return f"needs Debian's {APT_PACKAGES} (apt-get install; .ci/run installs them)"
    return None


def run(
    args: list[str], env: dict[str, str] | None = None, timeout: float = 600, **kwargs
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, check=False, **kwargs
    )
    if result.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} exited {result.returncode}:\n"
            f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


class Dockerd:
    """A ``dockerd`` of the test's own, on a private socket and data root."""

    def __init__(self) -> None:
        # Short: containerd's socket paths under the exec root must fit in 108 bytes.
        self.root = Path(tempfile.mkdtemp(prefix="keeld-", dir="/tmp"))
        self.socket = self.root / "docker.sock"
        self.process: subprocess.Popen | None = None
        self.had_bridge = Path("/sys/class/net/docker0").exists()

    @property
    def env(self) -> dict[str, str]:
        """An environment for ``docker`` and ``docker-compose`` talking to this daemon
        (no ``KEEL_*`` variable of the test process leaks into compose's interpolation)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "DOCKER_"))}
        env.update(DOCKER_HOST=f"unix://{self.socket}", DOCKER_BUILDKIT="0")
        return env

    def start(self) -> Dockerd:
        log = (self.root / "dockerd.log").open("wb")
        self.process = subprocess.Popen(
            [
                "dockerd",
                "--data-root",
                str(self.root / "data"),
                "--exec-root",
                str(self.root / "exec"),
                "-H",
                f"unix://{self.socket}",
                "--pidfile",
                str(self.root / "dockerd.pid"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"dockerd exited: {self.log()[-3000:]}")
            probe = subprocess.run(
                [DOCKER, "version"], env=self.env, capture_output=True, timeout=10, check=False
            )
            if probe.returncode == 0:
                return self
            time.sleep(0.5)
        raise AssertionError(f"dockerd did not answer in 60 s: {self.log()[-3000:]}")

    def log(self) -> str:
        return (self.root / "dockerd.log").read_text(errors="replace")

    def docker(self, *args: str, timeout: float = 600, **kwargs) -> str:
        return run([DOCKER, *args], env=self.env, timeout=timeout, **kwargs).stdout

    def descendants(self) -> list[psutil.Process]:
        if self.process is None:
            return []
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(Exception):
                ids = self.docker("ps", "-aq", timeout=30).split()
                if ids:
                    self.docker("rm", "-f", "-v", *ids, timeout=120)
                self.docker("network", "prune", "-f", timeout=60)
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        if not self.had_bridge and Path("/sys/class/net/docker0").exists():
            subprocess.run(["ip", "link", "delete", "docker0"], check=False, capture_output=True)
        # Whatever dockerd left mounted under its roots (it unmounts on a clean stop).
        for part in sorted(psutil.disk_partitions(all=True), key=lambda p: -len(p.mountpoint)):
            if part.mountpoint.startswith(str(self.root)):
                subprocess.run(["umount", "-l", part.mountpoint], check=False, capture_output=True)
        kept_logs.keep(self.root, self.root.name, skip=("data", "exec"))  # dockerd.log
        shutil.rmtree(self.root, ignore_errors=True)

    def build(self, tag: str, context: Path, **build_args: str) -> None:
        """``docker build`` (the legacy builder) on the host's network: pip and apt reach out."""
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
        self.docker("build", "--network=host", "-q", "-t", tag, *args, str(context), timeout=900)


def base_rootfs() -> Path:
    """A tarball of Debian bookworm (minbase) with python3, venv and pip, and the host's
    extra CA certificates (an intercepting TLS proxy may stand between pip and PyPI)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    month = datetime.date.today().strftime("%Y%m")
    tarball = CACHE / f"debian-python-bookworm-{month}.tar"
    if tarball.exists():
        return tarball
    for old in CACHE.glob("debian-python-bookworm-*.tar"):
        old.unlink(missing_ok=True)
    rootfs = Path(tempfile.mkdtemp(prefix="rootfs-", dir=CACHE))
    try:
        run(
            [
                "debootstrap",
                "--variant=minbase",
                "--include=python3,python3-venv,python3-pip,ca-certificates",
                "bookworm",
                str(rootfs),
                "http://deb.debian.org/debian",
            ],
            timeout=900,
        )
        for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copy(crt, rootfs / "usr/local/share/ca-certificates" / crt.name)
        run(["chroot", str(rootfs), "update-ca-certificates"])
        sources = Path("/etc/apt/sources.list.d/debian.sources")
        if sources.exists():
            shutil.copy(sources, rootfs / "etc/apt/sources.list.d/debian.sources")
            (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
        run(["chroot", str(rootfs), "apt-get", "clean"])
        for lists in (rootfs / "var/lib/apt/lists").glob("*_*"):
            lists.unlink()
        partial = tarball.with_suffix(".partial")
        run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], timeout=300)
        partial.rename(tarball)
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return tarball


POSTGRES_DOCKERFILE = f"""\
FROM {BASE_IMAGE}
RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && mkdir -p /etc/postgresql-common/createcluster.d \\
 && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/keel.conf \\
 && apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      postgresql-15 >/dev/null \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && mkdir -p /var/lib/postgresql/data /run/postgresql \\
 && chown postgres:postgres /var/lib/postgresql/data /run/postgresql \\
 && chmod 0700 /var/lib/postgresql/data
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH PGDATA=/var/lib/postgresql/data
USER postgres
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["postgres", "-c", "listen_addresses=*"]
"""

# What the official image does with POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB,
# on a first start: a cluster whose superuser is POSTGRES_USER, password auth over TCP.
POSTGRES_ENTRYPOINT = """\
#!/bin/sh
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  umask 077
  printf '%s\\n' "${POSTGRES_PASSWORD:?}" > /tmp/pwfile
  initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile \\
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f /tmp/pwfile
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  if [ "$POSTGRES_DB" != postgres ]; then
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
    createdb -U "$POSTGRES_USER" "$POSTGRES_DB"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
exec "$@"
"""

REDIS_DOCKERFILE = f"""\
FROM {BASE_IMAGE}
RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      redis-server redis-tools >/dev/null \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && mkdir -p /data && chown redis:redis /data
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
USER redis
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["redis-server"]
"""

# As the official image: a server started without a config file takes connections from
# the container network (protected mode off; the network is the boundary).
REDIS_ENTRYPOINT = """\
#!/bin/sh
set -eu
if [ "$1" = redis-server ]; then
  shift
  exec redis-server "$@" --protected-mode no
fi
exec "$@"
"""

RABBITMQ_DOCKERFILE = f"""\
FROM {BASE_IMAGE}
RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \\
      rabbitmq-server >/dev/null \\
 && apt-get clean && rm -rf /var/lib/apt/lists/* \\
 && mkdir -p /var/lib/rabbitmq /etc/rabbitmq \\
 && chown rabbitmq:rabbitmq /var/lib/rabbitmq /etc/rabbitmq
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
USER rabbitmq
ENV HOME=/var/lib/rabbitmq
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["rabbitmq-server"]
"""

# The official image's RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS, reachable off loopback.
RABBITMQ_ENTRYPOINT = """\
#!/bin/sh
set -eu
cat > /etc/rabbitmq/rabbitmq.conf <<CONF
default_user = ${RABBITMQ_DEFAULT_USER:-guest}
default_pass = ${RABBITMQ_DEFAULT_PASS:-guest}
loopback_users = none
listeners.tcp.default = 5672
CONF
exec "$@"
"""


def build_rabbitmq(dockerd: Dockerd) -> None:
    """The RabbitMQ stand-in (the base image must be there: ``build_images``)."""
    _build_standin(dockerd, RABBITMQ_IMAGE, RABBITMQ_DOCKERFILE, RABBITMQ_ENTRYPOINT)


def _build_standin(dockerd: Dockerd, tag: str, dockerfile: str, entrypoint: str) -> None:
    context = Path(tempfile.mkdtemp(prefix="standin-", dir=dockerd.root))
    (context / "Dockerfile").write_text(dockerfile)
    (context / "entrypoint.sh").write_text(entrypoint)
    (context / "entrypoint.sh").chmod(0o755)
    dockerd.build(tag, context)


def build_images(dockerd: Dockerd) -> None:
    """The base image (from the cached rootfs) and the Postgres and Redis stand-ins."""
    with base_rootfs().open("rb") as tarball:
        run(
            [
                DOCKER,
                "import",
                "--change",
                "ENV LANG=C.UTF-8",
                "-",
                BASE_IMAGE,
            ],
            env=dockerd.env,
            stdin=tarball,
            timeout=300,
        )
    _build_standin(dockerd, POSTGRES_IMAGE, POSTGRES_DOCKERFILE, POSTGRES_ENTRYPOINT)
    _build_standin(dockerd, REDIS_IMAGE, REDIS_DOCKERFILE, REDIS_ENTRYPOINT)


def wait_for(probe, timeout: float, what: str):
    """``probe()``'s first true value, asked every 0.5 s for ``timeout`` s; else an error
    naming ``what`` (a container's minutes-long start says which step it waited for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what}: not in {timeout} s")
