"""deploy/kubernetes, run: ``podman kube play`` (Debian's podman 4) of the rendered redis
overlay, on Keel's image built from this tree on the debootstrapped base, beside
Postgres and Redis stand-ins played as pods named as the Secret's URLs name them.

The migrate Job's pod runs first, to its end (podman plays no Jobs: its pod template is
played as a Pod), then the web, worker and beat Deployments (two worker pods, one web and
one beat), with their security contexts (uid 1000, read-only root filesystem, Keel's
writable paths on volumes): worker and beat pass their liveness probes (the exec
commands the manifests give, run by podman as health checks), the web pod answers its
probes' paths, and a report completes with a token made by ``keel token`` in the web
pod. Then the worker pod running a report is stopped with the grace period its
Deployment gives: it stops consuming, finishes the report and exits 0; the report is
completed once, and the other worker runs the next one.

What podman 4.3 does not do here, and so is not tested: Services, PodDisruptionBudgets
and the ServiceAccount (not played); readiness and startup probes, and httpGet liveness
probes (podman makes those a ``curl`` of port 0 for a named port, and the image has no
curl; the test requests the same paths instead); emptyDir (played as named volumes shared
by the pods, not one per pod); terminationGracePeriodSeconds (the test passes it to
``podman pod stop``); Secrets in the played YAML (made podman secrets first). Flower is
not played. ~2 minutes on 2 cores once the images are cached.
"""

from __future__ import annotations

import copy
import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tests.support import containers, podman
from tests.support.containers import wait_for
from tests.support.stack import PROJECT_ROOT

# A release check (the image built and the manifests played, ~4 minutes): the slow tier.
pytestmark = [
    pytest.mark.stack,
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.timeout(900),
]

KEEL_IMAGE = "keel-test/keel:kube"
DEPLOY = PROJECT_ROOT / "deploy" / "kubernetes"
REPLICAS = {"keel-web": 1, "keel-worker": 2, "keel-beat": 1}
# Slow enough that a worker is stopped in the middle of a report's steps.
STEP_PAUSE_MS = 2500


def render(image: str) -> list[dict[str, Any]]:
    """The redis overlay, its image set as a user's kustomization sets it."""
    folder = Path(tempfile.mkdtemp(prefix="kustomize-"))
    try:
        name, _, tag = image.rpartition(":")
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(DEPLOY / "overlays" / "redis", folder)],
            "images": [{"name": "keel", "newName": f"localhost/{name}", "newTag": tag}],
        }
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        kubectl = shutil.which("kubectl") or "/usr/bin/kubectl"
        done = containers.run([kubectl, "kustomize", str(folder)], timeout=60)
        return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def named(objects: list[dict], kind: str, name: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def as_pod(job: dict) -> dict:
    """A Job's pod template as a Pod (what the Job controller would create)."""
    template = copy.deepcopy(job["spec"]["template"])
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": job["metadata"]["name"], "labels": template["metadata"]["labels"]},
        "spec": template["spec"],
    }


STANDINS = [
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "postgres"},
        "spec": {
            "containers": [
                {
                    "name": "postgres",
                    "image": f"localhost/{containers.POSTGRES_IMAGE}",
                    "env": [
                        {"name": "POSTGRES_USER", "value": "keel"},
                        {"name": "POSTGRES_PASSWORD", "value": "keel"},
                        {"name": "POSTGRES_DB", "value": "keel"},
                    ],
                }
            ]
        },
    },
    {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "redis"},
        "spec": {"containers": [{"name": "redis", "image": f"localhost/{containers.REDIS_IMAGE}"}]},
    },
]


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=3).status_code == 200
    except requests.RequestException:
        return False


class Played:
    """The played stack: its objects as rendered, and where its API answers."""

    def __init__(self, pods: podman.Podman, objects: list[dict]) -> None:
        self.pods = pods
        self.objects = objects
        self.api = ""
        self.headers: dict[str, str] = {}

    def container(self, deployment: str, index: int = 0) -> str:
        box = named(self.objects, "Deployment", deployment)["spec"]["template"]["spec"]
        return f"{deployment}-pod-{index}-{box['containers'][0]['name']}"

    def probe(self, deployment: str) -> list[str]:
        spec = named(self.objects, "Deployment", deployment)["spec"]["template"]["spec"]
        return spec["containers"][0]["livenessProbe"]["exec"]["command"]

    def add_report(self, report_id: str, rows: int = 1000) -> str:
        added = requests.post(
            f"{self.api}/api/v1/reports",
            json={"reportId": report_id, "rows": rows},
            headers=self.headers,
            timeout=10,
        )
        assert added.status_code == 202, added.text
        return added.json()["statusUrl"]

    def job(self, status_url: str) -> dict:
        return requests.get(self.api + status_url, headers=self.headers, timeout=5).json()

    def completed(self, status_url: str, timeout: float = 90) -> dict:
        def done():
            job = self.job(status_url)
            assert job["state"] not in ("failed", "cancelled"), job
            return job if job["state"] == "completed" else None

        return wait_for(done, timeout, f"{status_url} completed")


@pytest.fixture(scope="module")
def played():
    reason = podman.missing()
    if reason:
        pytest.skip(reason)
    pods = podman.Podman()
    try:
        started = time.monotonic()
        pods.build_images()
        pods.build(KEEL_IMAGE, PROJECT_ROOT, BASE_IMAGE=containers.BASE_IMAGE)
        print(f"images in {time.monotonic() - started:.0f} s")
        pods.start()
        objects = render(KEEL_IMAGE)
        named(objects, "ConfigMap", "keel-config")["data"]["KEEL_REPORT_STEP_PAUSE_MS"] = str(
            STEP_PAUSE_MS
        )
        values = {
            "KEEL_DATABASE_URL": "postgresql://keel:keel@postgres:5432/keel",
            "KEEL_REDIS_URL": "redis://redis:6379/0",
            "KEEL_BROKER_URL": "",
            "KEEL_SECRET_KEY": secrets.token_hex(32),
            "KEEL_METRICS_TOKEN": secrets.token_hex(16),
        }
        base_secret = named(objects, "Secret", "keel-secrets")["stringData"]
        assert set(values) == set(base_secret), "the Secret's keys changed"
        pods.secret("keel-secrets", values)
        pods.secret("keel-flower", {"FLOWER_BASIC_AUTH": "keel:" + secrets.token_hex(8)})

        pods.play(STANDINS)
        wait_for(
            lambda: (
                pods.quiet("exec", "postgres-postgres", "pg_isready", "-h", "127.0.0.1").returncode
                == 0
            ),
            60,
            "Postgres answered",
        )
        config = named(objects, "ConfigMap", "keel-config")
        # The migrate Job's pod, to its end, before any Deployment.
        pods.play([config, as_pod(named(objects, "Job", "keel-migrate"))])
        code = pods("wait", "keel-migrate-migrate", timeout=180).strip()
        assert code == "0", pods.logs("keel-migrate-migrate")

        deployments = []
        for name, replicas in REPLICAS.items():
            deployment = copy.deepcopy(named(objects, "Deployment", name))
            deployment["spec"]["replicas"] = replicas
            # Debian's podman (4.3) cannot start a pod that shares its process namespace
            # with an init container ("failed to remove once init container ... as it is
            # running"). Their wait (keel db wait) would end at once here, the migrate pod
            # having run to its end above; tests/integration/test_db_wait.py runs it.
            deployment["spec"]["template"]["spec"].pop("initContainers", None)
            deployments.append(deployment)
        pods.play([config, *deployments])
        stack = Played(pods, objects)
        for name, replicas in REPLICAS.items():
            for index in range(replicas):
                if name != "keel-web":
                    pods.wait_healthy(stack.container(name, index), timeout=180)
        stack.api = f"http://{pods.address(stack.container('keel-web'))}:8000"
        wait_for(lambda: answers(f"{stack.api}/healthz"), 90, "the web pod's /healthz")
        wait_for(lambda: answers(f"{stack.api}/readyz"), 30, "the web pod's /readyz")
        print(f"healthy {time.monotonic() - started:.0f} s after the build began")
        token = pods(
            "exec",
            stack.container("keel-web"),
            "keel",
            "token",
            "--tenant",
            "acme",
            "--user",
            "alice",
        ).strip()
        stack.headers = {"Authorization": f"Bearer {token}"}
        yield stack
    finally:
        pods.stop()


def test_the_pods_run_as_the_manifests_say(played):
    pods = played.pods
    for name in REPLICAS:
        box = played.container(name)
        found = pods("inspect", box, "--format", "{{.Config.User}} {{.HostConfig.ReadonlyRootfs}}")
        assert found.split() == ["1000:1000", "true"], (box, found)
        # the liveness probe is the manifest's own exec command (worker, beat)
        if name != "keel-web":
            check = pods("inspect", box, "--format", "{{json .Config.Healthcheck.Test}}")
            assert " ".join(played.probe(name)) in " ".join(yaml.safe_load(check)), check
    # Keel's writable paths are writable, and nothing else is
    web = played.container("keel-web")
    script = "touch /var/lib/keel/w /tmp/w && ! touch /app/w 2>/dev/null && id -u"
    assert pods("exec", web, "sh", "-c", script).strip() == "1000"


def test_a_report_completes(played):
    job = played.completed(played.add_report("kube-q1"))
    assert job["progress"]["percent"] == 100
    assert job["attemptsStarted"] == 1


def test_a_worker_pod_stopped_mid_job_finishes_it_and_loses_nothing(played):
    pods = played.pods
    status_url = played.add_report("kube-q2")
    job_id = status_url.rstrip("/").rsplit("/", 1)[-1]
    wait_for(lambda: played.job(status_url)["state"] == "active", 30, "the report started")

    def running_it():
        for index in range(REPLICAS["keel-worker"]):
            box = played.container("keel-worker", index)
            if job_id in pods.logs(box, tail=200):
                return index + 1
        return None

    index = wait_for(running_it, 20, "a worker logged the report") - 1
    stopped = played.container("keel-worker", index)
    other = played.container("keel-worker", 1 - index)
    worker = named(played.objects, "Deployment", "keel-worker")["spec"]["template"]["spec"]
    grace = worker["terminationGracePeriodSeconds"]
    assert played.job(status_url)["state"] == "active", "the report ended before the stop"

    # As the kubelet stops a pod: SIGTERM to its container, SIGKILL after the grace, and
    # the pod's sandbox after that (stopped at once, podman's infra container, PID 1 of the
    # pod's shared PID namespace, would take every process of the pod with it).
    began = time.monotonic()
    pods("stop", "-t", str(grace), stopped, timeout=grace + 60)
    took = time.monotonic() - began
    print(f"{stopped}: stopped in {took:.1f} s (grace {grace} s)")
    pods("pod", "stop", f"keel-worker-pod-{index}", timeout=60)
    # A warm shutdown: the worker ended on its own, within the grace, not killed at its end.
    assert pods.exit_code(stopped) == 0, pods.logs(stopped)
    assert took < grace - 5, f"the stop took {took:.0f} s of {grace}"
    logs = pods.logs(stopped, tail=400)
    assert "warm shutdown" in logs.lower(), logs[-3000:]

    job = played.completed(status_url, timeout=60)
    assert job["progress"]["percent"] == 100
    # Finished by the worker that was stopping: run once, never recovered as stalled.
    assert job["attemptsStarted"] == 1, job
    assert job["attemptsMade"] == 0, job

    # The other worker goes on, and takes the next report.
    pods.wait_healthy(other, timeout=30)
    following = played.completed(played.add_report("kube-q3"))
    assert following["attemptsStarted"] == 1
    assert job_id not in pods.logs(other, tail=400)
