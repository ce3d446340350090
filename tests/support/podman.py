"""Podman for the ``container`` tier's Kubernetes test (tests/container/test_kube_play.py):
``podman kube play`` of the rendered manifests (deploy/kubernetes), as root, on this
machine's Debian podman.

Images live in a store of the tier's own, kept beside the debootstrapped base's tarball
(``$KEEL_CONTAINER_CACHE/podman``), so a second run builds only what changed: the base is
imported once per tarball (a fresh import would be a new image and void every cached
layer above it), the Postgres and Redis stand-ins are built from the Dockerfiles of
``tests.support.containers`` and Keel's image from the repository's Dockerfile, each
with podman's own layer cache. ``stop()`` removes what a run started (pods, containers,
volumes, secrets, its network): nothing of a run is left in the store but images.
Network: a bridge network of the run's own (netavark, with its DNS: a pod's name is its
host name), cgroups by cgroupfs (no systemd here: health checks run on demand), overlay
storage, runc. Pods need podman's pause image, which it builds from Debian's catatonit.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import yaml

from tests.support import containers

PODMAN = "/usr/bin/podman"
APT_PACKAGES = "podman catatonit netavark aardvark-dns"
STORE = containers.CACHE / "podman"
# Podman's state database (in the store) records where its run state lives: one fixed
# place (a tmpfs on most machines), emptied of a run's containers by ``stop()``.
RUNROOT = Path("/run/keel-test-podman")


def missing() -> str | None:
    """Why this machine cannot run podman's part of the tier (None: it can)."""
    if os.geteuid() != 0:
        return "podman kube play here runs as root"
    tools = [PODMAN, shutil.which("catatonit"), shutil.which("debootstrap")]
    if not all(tool and os.access(tool, os.X_OK) for tool in tools):
        return f"needs Debian's {APT_PACKAGES} and debootstrap (apt-get install; .ci/run does)"
    return None


class Podman:
    """``podman`` on the tier's image store and a run root of its own."""

    def __init__(self) -> None:
        STORE.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(tempfile.mkdtemp(prefix="keelpod-", dir="/tmp"))
        self.network = f"keelkube{uuid.uuid4().hex[:8]}"
        # Podman as root gives every container nofile and nproc limits of about a million,
        # which runc must set and a machine without CAP_SYS_RESOURCE (this one) refuses:
        # the machine's own hard limits instead, capped where runc was seen to manage.
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nofile = 65536 if nofile == resource.RLIM_INFINITY else min(nofile, 65536)
        nproc = 32768 if nproc == resource.RLIM_INFINITY else min(nproc, 32768)
        limits = f'"nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"'
        (self.scratch / "containers.conf").write_text(
            f"[containers]\ndefault_ulimits = [{limits}]\n"
        )

    def args(self, *args: str) -> list[str]:
        return [
            PODMAN,
            "--root",
            str(STORE / "root"),
            "--runroot",
            str(RUNROOT / "run"),
            "--tmpdir",
            str(RUNROOT / "tmp"),
            "--cgroup-manager",
            "cgroupfs",
            "--storage-driver",
            "overlay",
            "--events-backend",
            "file",
            "--runtime",
            "runc",
            *args,
        ]

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KEEL_", "CONTAINER"))}
        return {**env, "CONTAINERS_CONF": str(self.scratch / "containers.conf")}

    def __call__(self, *args: str, timeout: float = 600, **kwargs) -> str:
        return containers.run(self.args(*args), env=self.env, timeout=timeout, **kwargs).stdout

    def quiet(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """A command whose failure is an answer, not an error."""
        return subprocess.run(
            self.args(*args),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def has_image(self, tag: str) -> bool:
        return self.quiet("image", "exists", tag).returncode == 0

    def label(self, tag: str, name: str) -> str | None:
        found = self.quiet("image", "inspect", "--format", "{{json .Labels}}", tag)
        if found.returncode != 0:
            return None
        return (json.loads(found.stdout or "null") or {}).get(name)

    def build(self, tag: str, context: Path, **build_args: str) -> None:
        args = [f"--build-arg={k}={v}" for k, v in build_args.items()]
        self(
            "build",
            "--network=host",
            "--format=docker",
            "--layers",
            "-q",
            "-t",
            tag,
            *args,
            str(context),
            timeout=1200,
        )

    def build_images(self) -> None:
        """The debootstrapped base and the Postgres and Redis stand-ins (cached)."""
        tarball = containers.base_rootfs()
        if self.label(containers.BASE_IMAGE, "keel.rootfs") != tarball.name:
            with tarball.open("rb") as stdin:
                self(
                    "import",
                    "--change",
                    "ENV LANG=C.UTF-8",
                    "--change",
                    f"LABEL keel.rootfs={tarball.name}",
                    "-",
                    containers.BASE_IMAGE,
                    stdin=stdin,
                    timeout=300,
                )
        for tag, dockerfile, entrypoint in (
            (
                containers.POSTGRES_IMAGE,
                containers.POSTGRES_DOCKERFILE,
                containers.POSTGRES_ENTRYPOINT,
            ),
            (containers.REDIS_IMAGE, containers.REDIS_DOCKERFILE, containers.REDIS_ENTRYPOINT),
        ):
            context = Path(tempfile.mkdtemp(prefix="standin-", dir=self.scratch))
            (context / "Dockerfile").write_text(dockerfile)
            (context / "entrypoint.sh").write_text(entrypoint)
            (context / "entrypoint.sh").chmod(0o755)
            self.build(tag, context)

    def start(self) -> Podman:
        self("network", "create", self.network, timeout=60)
        return self

    def play(self, objects: list[dict]) -> str:
        """``podman kube play`` of ``objects`` on the run's network."""
        path = self.scratch / f"play-{uuid.uuid4().hex[:8]}.yaml"
        path.write_text(yaml.safe_dump_all(objects))
        return self("kube", "play", "--network", self.network, str(path), timeout=300)

    def secret(self, name: str, values: dict[str, str]) -> None:
        """A Kubernetes Secret as podman 4's ``kube play`` reads one: a podman secret of
        that name holding a JSON object of base64 values (a Secret in the played YAML is
        not read)."""
        path = self.scratch / f"{name}.json"
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}
        path.write_text(json.dumps(encoded))
        self.quiet("secret", "rm", name)
        self("secret", "create", name, str(path), timeout=60)

    def address(self, container: str) -> str:
        """The container's address on the run's network (reachable from this host)."""
        found = json.loads(self("inspect", container, timeout=60))[0]
        return found["NetworkSettings"]["Networks"][self.network]["IPAddress"]

    def exit_code(self, container: str) -> int | None:
        state = json.loads(self("inspect", container, timeout=60))[0]["State"]
        return None if state["Running"] else int(state["ExitCode"])

    def wait_healthy(self, container: str, timeout: float = 180) -> None:
        """Until podman's health check of ``container`` (its liveness probe, as kube play
        makes it) passes; podman runs it on demand here (no systemd timers)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            state = self.quiet("inspect", "--format", "{{.State.Status}}", container)
            if state.stdout.strip() in ("exited", "stopped"):
                raise AssertionError(f"{container} exited:\n{self.logs(container)}")
            check = self.quiet("healthcheck", "run", container, timeout=60)
            if check.returncode == 0:
                return
            last = check.stdout + check.stderr
            time.sleep(2)
        raise AssertionError(
            f"{container} not healthy in {timeout} s: {last}\n{self.logs(container)}"
        )

    def logs(self, container: str, tail: int = 40) -> str:
        done = self.quiet("logs", "--tail", str(tail), container)
        return done.stdout + done.stderr

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.quiet("pod", "rm", "-a", "-f", "-t", "5", timeout=180)
            self.quiet("secret", "rm", "-a", timeout=60)
            self.quiet("rm", "-a", "-f", "-v", "-t", "5", timeout=120)
            self.quiet("volume", "prune", "-f", timeout=60)
            self.quiet("network", "rm", "-f", self.network, timeout=60)
        shutil.rmtree(self.scratch, ignore_errors=True)
