"""deploy/kubernetes, rendered as ``kubectl kustomize`` renders it and checked without a
cluster: every object of the base, both overlays and the optional components against
the Kubernetes API's schemas (``kubernetes-validate``, strict: an unknown field is an
error), the CRDs' objects (KEDA, Prometheus Operator) by their structure, and the rules
a deployment of Keel must keep: a worker's grace period covers its longest run (its time
limits and the longest ``timeout`` a job may ask for), nothing runs as root or can gain
privileges, the root filesystem is read-only with Keel's writable paths mounted, every
container has resources and its probes, and the documented first apply creates everything
the migrate Job's pod needs. Each rule is
shown to fail on a copy broken on purpose. The PrometheusRule is the repository's
rules file, unchanged.
"""

from __future__ import annotations

import base64
import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tasks.platform.config import Settings
from tests.support.stack import PROJECT_ROOT

kubernetes_validate = pytest.importorskip("kubernetes_validate")

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
DEPLOY = PROJECT_ROOT / "deploy" / "kubernetes"
GUIDE = PROJECT_ROOT / "docs" / "operations" / "kubernetes.md"
OVERLAYS = ("redis", "rabbitmq")
COMPONENTS = ("keda", "hpa", "monitoring")
# The oldest Kubernetes release still served by the big providers, and the newest the
# schemas know.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# What a worker needs after its longest run: the run's end recorded (a hard time limit's
# kill and its record, bounded at 2 s), events and counts flushed, connections closed.
SHUTDOWN_MARGIN_S = 30
# The longest `timeout` option a job may ask for (JobOptions), as the worker's environment
# sets it; unset, the setting's default.
JOB_TIMEOUT_CAP = "KEEL_MAX_JOB_TIMEOUT_S"
# Keel's writable paths under a read-only root: KEEL_HOME (the image's) and /tmp.
WRITABLE = ("/var/lib/keel", "/tmp")
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}

pytestmark = pytest.mark.skipif(
    not os.access(KUBECTL, os.X_OK), reason="needs kubectl (kustomize) to render the manifests"
)


def kustomize(path: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [KUBECTL, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def with_components(overlay: str, *components: str, images: str | None = None) -> list[dict]:
    """An overlay with optional components, as a user's own kustomization adds them."""
    folder = Path(tempfile.mkdtemp(prefix="kustomize-"))
    try:
        up = os.path.relpath(DEPLOY, folder)
        kustomization: dict[str, Any] = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [f"{up}/overlays/{overlay}"],
            "components": [f"{up}/components/{name}" for name in components],
        }
        if images:
            name, _, tag = images.rpartition(":")
            kustomization["images"] = [{"name": "keel", "newName": name, "newTag": tag}]
        (folder / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        return kustomize(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    """Every way the manifests are meant to be rendered, by name."""
    found = {"base": kustomize(DEPLOY / "base")}
    for overlay in OVERLAYS:
        found[overlay] = kustomize(DEPLOY / "overlays" / overlay)
    found["redis+keda+monitoring"] = with_components("redis", "keda", "monitoring")
    found["rabbitmq+hpa+monitoring"] = with_components("rabbitmq", "hpa", "monitoring")
    return found


def every_object(rendered: dict[str, list[dict]]) -> Iterator[tuple[str, dict]]:
    for name, objects in rendered.items():
        for obj in objects:
            yield name, obj


def pod_specs(objects: list[dict]) -> Iterator[tuple[str, dict]]:
    for obj in objects:
        if obj["kind"] in ("Deployment", "Job", "StatefulSet", "DaemonSet"):
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def named(objects: list[dict], kind: str, name: str) -> dict:
    [found] = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def container(objects: list[dict], deployment: str) -> dict:
    [only] = named(objects, "Deployment", deployment)["spec"]["template"]["spec"]["containers"]
    return only


# -- the rules, each a function returning what breaks it (empty: kept) -------------------


def longest_task_time_limit() -> float:
    """The longest hard time limit a task of Keel's app declares (the built-in apps')."""
    code = (
        "from keel import app; app.loader.import_default_modules();"
        "print(max([float(t.time_limit or 0) for t in app.tasks.values()] + [0]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=PROJECT_ROOT,
        env={**os.environ, "KEEL_BUILTIN_JOBS": "reports,notifications"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return float(done.stdout.strip().splitlines()[-1])


def option(command: list[str], name: str) -> float | None:
    for i, arg in enumerate(command):
        if arg.startswith(f"{name}="):
            return float(arg.split("=", 1)[1])
        if arg == name and i + 1 < len(command):
            return float(command[i + 1])
    return None


def environment(objects: list[dict], box: dict) -> dict[str, str]:
    """A container's variables as Kubernetes sets them: its ``envFrom`` ConfigMaps and
    Secrets in order, then its own ``env`` values."""
    found: dict[str, str] = {}
    for source in box.get("envFrom", []):
        if "configMapRef" in source:
            found.update(named(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
        if "secretRef" in source:
            secret = named(objects, "Secret", source["secretRef"]["name"])
            data = secret.get("data") or {}
            found.update({key: base64.b64decode(v).decode() for key, v in data.items()})
            found.update(secret.get("stringData") or {})
    found.update({var["name"]: var["value"] for var in box.get("env", []) if "value" in var})
    return found


def job_timeout_cap(objects: list[dict], box: dict) -> float:
    """The longest ``timeout`` a job may ask for in this container, in seconds."""
    given = environment(objects, box).get(JOB_TIMEOUT_CAP, "").strip()
    return float(given) if given else float(Settings.model_fields["max_job_timeout_s"].default)


def grace_problems(objects: list[dict], task_limit: float = 0) -> list[str]:
    """Worker Deployments whose grace period is shorter than their longest run may take
    (the worker's --time-limit, a task's own limit if longer, or the longest ``timeout``
    a job may ask for, KEEL_MAX_JOB_TIMEOUT_S) plus the margin."""
    problems = []
    for obj in objects:
        if obj["kind"] != "Deployment":
            continue
        spec = obj["spec"]["template"]["spec"]
        for box in spec["containers"]:
            command = [*box.get("command", []), *box.get("args", [])]
            if "worker" not in command or "celery" not in command[0]:
                continue
            name = obj["metadata"]["name"]
            limit = option(command, "--time-limit")
            if limit is None:
                problems.append(f"{name}: no --time-limit, so no grace period covers a run")
                continue
            grace = spec.get("terminationGracePeriodSeconds", 30)
            longest = max(limit, option(command, "--soft-time-limit") or 0, task_limit)
            if grace < longest + SHUTDOWN_MARGIN_S:
                problems.append(
                    f"{name}: terminationGracePeriodSeconds {grace} < longest time limit "
                    f"{longest:g} + {SHUTDOWN_MARGIN_S}"
                )
            cap = job_timeout_cap(objects, box)
            if grace < cap + SHUTDOWN_MARGIN_S:
                problems.append(
                    f"{name}: terminationGracePeriodSeconds {grace} < {JOB_TIMEOUT_CAP} "
                    f"{cap:g} + {SHUTDOWN_MARGIN_S}"
                )
    return problems


def root_problems(objects: list[dict]) -> list[str]:
    """Containers (init containers too) that could run as root or gain privileges."""
    problems = []
    for where, spec in pod_specs(objects):
        pod = spec.get("securityContext") or {}
        for box in [*spec.get("initContainers", []), *spec["containers"]]:
            mine = box.get("securityContext") or {}
            effective = {**pod, **mine}
            name = f"{where}/{box['name']}"
            if effective.get("runAsNonRoot") is not True:
                problems.append(f"{name}: runAsNonRoot is not true")
            if effective.get("runAsUser", 0) == 0:
                problems.append(f"{name}: runAsUser is not set to a non-zero uid")
            if mine.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{name}: allowPrivilegeEscalation is not false")
            if mine.get("privileged"):
                problems.append(f"{name}: privileged")
            if "ALL" not in (mine.get("capabilities") or {}).get("drop", []):
                problems.append(f"{name}: capabilities not dropped")
    return problems


def filesystem_problems(objects: list[dict]) -> list[str]:
    """Containers with a writable root filesystem, or without Keel's writable paths."""
    problems = []
    for where, spec in pod_specs(objects):
        empty = {v["name"] for v in spec.get("volumes", []) if "emptyDir" in v}
        for box in spec["containers"]:
            name = f"{where}/{box['name']}"
            if (box.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
                problems.append(f"{name}: root filesystem writable")
            mounted = {m["mountPath"] for m in box.get("volumeMounts", []) if m["name"] in empty}
            for path in WRITABLE:
                if path not in mounted:
                    problems.append(f"{name}: {path} is not an emptyDir")
    return problems


def first_apply_selector() -> str:
    """The label selector of the first apply in docs/operations/kubernetes.md."""
    found = re.findall(r"kubectl apply -k \S+ -l '([^']+)'", GUIDE.read_text())
    assert len(found) == 1, found
    return found[0]


def selects(selector: str, labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (equality and set terms) selects ``labels``."""
    for term in (t.strip() for t in re.split(r",(?![^()]*\))", selector)):
        if shape := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, how, values = shape.groups()
            within = labels.get(key) in {v.strip() for v in values.split(",")}
            if within is not (how == "in"):
                return False
        elif shape := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)", term):
            key, how, value = shape.groups()
            if (labels.get(key) == value) is (how == "!="):
                return False
        elif shape := re.fullmatch(r"(!?)([\w./-]+)", term):
            if (shape.group(2) in labels) is bool(shape.group(1)):
                return False
        else:
            raise AssertionError(f"a selector term this test cannot read: {term!r}")
    return True


def references(spec: dict) -> set[tuple[str, str]]:
    """The objects a pod spec names: its ServiceAccount, the ConfigMaps and Secrets of its
    containers' environment and of its volumes, its image pull Secrets."""
    found = set()
    if spec.get("serviceAccountName"):
        found.add(("ServiceAccount", spec["serviceAccountName"]))
    found |= {("Secret", each["name"]) for each in spec.get("imagePullSecrets", [])}
    for box in [*spec.get("initContainers", []), *spec["containers"]]:
        for source in box.get("envFrom", []):
            found |= {(kind, source[key]["name"]) for key, kind in REFS.items() if key in source}
        for var in box.get("env", []):
            source = var.get("valueFrom") or {}
            found |= {
                (kind, source[key]["name"]) for key, kind in KEY_REFS.items() if key in source
            }
    for volume in spec.get("volumes", []):
        sources = [volume, *(volume.get("projected") or {}).get("sources", [])]
        for source in sources:
            if "configMap" in source:
                found.add(("ConfigMap", source["configMap"]["name"]))
            if "secret" in source:
                secret = source["secret"]
                found.add(("Secret", secret.get("secretName") or secret.get("name")))
    return found


REFS = {"configMapRef": "ConfigMap", "secretRef": "Secret"}
KEY_REFS = {"configMapKeyRef": "ConfigMap", "secretKeyRef": "Secret"}


def first_apply_problems(objects: list[dict], selector: str) -> list[str]:
    """What the first apply (``-l selector``) leaves out of what the migrate Job's pod needs
    to be created: the Job itself, or an object its pod names."""
    job = named(objects, "Job", "keel-migrate")
    problems = []
    if not selects(selector, job["metadata"].get("labels") or {}):
        problems.append(f"Job/keel-migrate: not selected by {selector!r}")
    for kind, name in sorted(references(job["spec"]["template"]["spec"])):
        found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
        if not found:
            problems.append(f"{kind}/{name}: named by the migrate Job's pod, not rendered")
        elif not selects(selector, found[0]["metadata"].get("labels") or {}):
            problems.append(f"{kind}/{name}: not selected by {selector!r}")
    return problems


# -- schemas -------------------------------------------------------------------------------


def test_the_base_and_both_overlays_render(rendered):
    for name in ("base", *OVERLAYS):
        kinds = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in rendered[name])
        assert kinds == sorted(
            [
                "ConfigMap/keel-config",
                "Deployment/keel-beat",
                "Deployment/keel-flower",
                "Deployment/keel-web",
                "Deployment/keel-worker",
                "Job/keel-migrate",
                "PodDisruptionBudget/keel-beat",
                "PodDisruptionBudget/keel-web",
                "PodDisruptionBudget/keel-worker",
                "Secret/keel-flower",
                "Secret/keel-secrets",
                "Service/keel-flower",
                "Service/keel-web",
                "ServiceAccount/keel",
            ]
        ), name
        # The base and its overlays need no CRD: they apply to any cluster.
        assert not {(o["apiVersion"], o["kind"]) for o in rendered[name]} & CRDS, name


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(rendered, version):
    checked = 0
    for name, obj in every_object(rendered):
        if (obj["apiVersion"], obj["kind"]) in CRDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            raise AssertionError(
                f"{name}: {obj['kind']}/{obj['metadata']['name']} on {version}: {error}"
            ) from error
        checked += 1
    assert checked >= 5 * 14


def test_the_schemas_catch_a_wrong_field(rendered):
    worker = copy.deepcopy(named(rendered["base"], "Deployment", "keel-worker"))
    worker["spec"]["template"]["spec"]["terminationGracePeriod"] = 330  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(worker, KUBERNETES_VERSIONS[-1], strict=True)


def test_the_crd_objects_have_their_required_fields(rendered):
    objects = rendered["redis+keda+monitoring"]
    scaled = named(objects, "ScaledObject", "keel-worker")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]
    assert (target.get("kind", "Deployment"), target["name"]) == ("Deployment", "keel-worker")
    # Never to zero: workers run the promoter and the reconciler, without which the
    # backlog the trigger reads never grows.
    assert scaled["spec"]["minReplicaCount"] >= 1
    assert scaled["spec"]["maxReplicaCount"] > scaled["spec"]["minReplicaCount"]
    triggers = scaled["spec"]["triggers"]
    assert triggers and all(t["type"] == "prometheus" for t in triggers)
    for trigger in triggers:
        meta = trigger["metadata"]
        assert {"serverAddress", "query", "threshold"} <= set(meta), trigger
        float(meta["threshold"])
        # Keel's own backlog, deduplicated across web pods; never a Redis list's length.
        assert 'keel_jobs{state="waiting"}' in meta["query"] or (
            "keel_oldest_waiting_seconds" in meta["query"]
        )
        assert "max by (queue)" in meta["query"]
    hpa = named(rendered["rabbitmq+hpa+monitoring"], "HorizontalPodAutoscaler", "keel-worker")
    assert hpa["spec"]["minReplicas"] >= 1
    assert hpa["spec"]["metrics"][0]["external"]["metric"]["name"] == "keel_jobs_waiting"

    monitor = named(objects, "ServiceMonitor", "keel-web")
    web = named(objects, "Service", "keel-web")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= web["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in web["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    token = endpoint["authorization"]["credentials"]
    secret = named(objects, "Secret", token["name"])
    assert token["key"] in secret["stringData"]
    # job="keel", the job the alerts name
    assert web["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "keel"
    config = named(objects, "ConfigMap", "keel-config")["data"]
    assert config["KEEL_METRICS_SCRAPE"] == "each", "each pod is scraped on its own"

    rule = named(objects, "PrometheusRule", "keel")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    for group in rule["spec"]["groups"]:
        assert group["name"] and group["rules"]
        for each in group["rules"]:
            assert each.get("alert") or each.get("record"), each
            assert each["expr"], each


def test_the_prometheus_rule_is_the_repositorys_rules_file(rendered):
    """components/monitoring/prometheusrule.yaml holds ops/prometheus/keel-alerts.yml as
    it is (deploy/kubernetes/sync_alerts.py writes it)."""
    rules = yaml.safe_load((PROJECT_ROOT / "ops" / "prometheus" / "keel-alerts.yml").read_text())
    rule = named(rendered["redis+keda+monitoring"], "PrometheusRule", "keel")
    assert rule["spec"] == {"groups": rules["groups"]}, (
        "components/monitoring/prometheusrule.yaml differs from ops/prometheus/keel-alerts.yml:"
        " run .venv/bin/python deploy/kubernetes/sync_alerts.py"
    )


# -- the rules a deployment of Keel keeps --------------------------------------------------


def test_a_workers_grace_period_covers_its_longest_run(rendered):
    task_limit = longest_task_time_limit()
    for name, objects in rendered.items():
        assert grace_problems(objects, task_limit) == [], name
    worker = named(rendered["base"], "Deployment", "keel-worker")
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 300 + 30


def test_the_grace_rule_fails_on_a_short_grace_or_no_time_limit(rendered):
    broken = copy.deepcopy(rendered["base"])
    worker = named(broken, "Deployment", "keel-worker")["spec"]["template"]["spec"]
    worker["terminationGracePeriodSeconds"] = 300  # the time limit, with no margin
    assert grace_problems(broken) == [
        "keel-worker: terminationGracePeriodSeconds 300 < longest time limit 300 + 30",
        f"keel-worker: terminationGracePeriodSeconds 300 < {JOB_TIMEOUT_CAP} 300 + 30",
    ]
    worker["terminationGracePeriodSeconds"] = 330
    assert grace_problems(broken, task_limit=600) != [], "a task's own longer limit counts"
    worker["containers"][0]["command"] = ["celery", "-A", "keel", "worker", "-l", "INFO"]
    assert grace_problems(broken) == [
        "keel-worker: no --time-limit, so no grace period covers a run"
    ]


def test_the_longest_timeout_a_job_may_ask_for_is_within_the_grace(rendered):
    for name, objects in rendered.items():
        worker = container(objects, "keel-worker")
        spec = named(objects, "Deployment", "keel-worker")["spec"]["template"]["spec"]
        cap = job_timeout_cap(objects, worker)
        assert cap + SHUTDOWN_MARGIN_S <= spec["terminationGracePeriodSeconds"], name
        # set by the ConfigMap (unset, a day: longer than any grace here)
        assert named(objects, "ConfigMap", "keel-config")["data"][JOB_TIMEOUT_CAP] == "300", name


def test_the_grace_rule_fails_when_a_job_may_ask_for_a_longer_timeout(rendered):
    broken = copy.deepcopy(rendered["base"])
    config = named(broken, "ConfigMap", "keel-config")["data"]
    config[JOB_TIMEOUT_CAP] = "600"  # the cap past the grace (330 s)
    assert grace_problems(broken) == [
        f"keel-worker: terminationGracePeriodSeconds 330 < {JOB_TIMEOUT_CAP} 600 + 30"
    ]
    del config[JOB_TIMEOUT_CAP]  # unset: the default, a day
    assert grace_problems(broken) == [
        f"keel-worker: terminationGracePeriodSeconds 330 < {JOB_TIMEOUT_CAP} 86400 + 30"
    ]
    config[JOB_TIMEOUT_CAP] = "300"
    assert grace_problems(broken) == []
    # The container's own env wins over the ConfigMap, as in Kubernetes.
    worker = container(broken, "keel-worker")
    worker["env"] = [{"name": JOB_TIMEOUT_CAP, "value": "3600"}]
    assert grace_problems(broken) == [
        f"keel-worker: terminationGracePeriodSeconds 330 < {JOB_TIMEOUT_CAP} 3600 + 30"
    ]


# -- the first apply: the migrate Job and what its pod needs --------------------------------


def test_the_first_apply_creates_everything_the_migrate_jobs_pod_needs(rendered):
    selector = first_apply_selector()
    assert selector == "app.kubernetes.io/component in (config,migrate)"
    for name in ("base", *OVERLAYS):
        objects = rendered[name]
        assert first_apply_problems(objects, selector) == [], name
        needed = references(named(objects, "Job", "keel-migrate")["spec"]["template"]["spec"])
        assert {
            ("ServiceAccount", "keel"),
            ("ConfigMap", "keel-config"),
            ("Secret", "keel-secrets"),
        } <= needed, name
        # and nothing that rolls a release: the Deployments wait for the second apply
        first = [o for o in objects if selects(selector, o["metadata"].get("labels") or {})]
        assert not [o for o in first if o["kind"] == "Deployment"], name


def test_the_first_apply_rule_fails_on_an_object_the_selector_leaves_out(rendered):
    selector = first_apply_selector()
    broken = copy.deepcopy(rendered["base"])
    del named(broken, "ServiceAccount", "keel")["metadata"]["labels"]["app.kubernetes.io/component"]
    assert first_apply_problems(broken, selector) == [
        f"ServiceAccount/keel: not selected by {selector!r}"
    ]
    broken = copy.deepcopy(rendered["base"])
    spec = named(broken, "Job", "keel-migrate")["spec"]["template"]["spec"]
    spec["volumes"].append({"name": "ca", "secret": {"secretName": "keel-flower"}})
    named(broken, "Secret", "keel-flower")["metadata"]["labels"].pop("app.kubernetes.io/component")
    spec["containers"][0]["env"] = [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "elsewhere", "key": "x"}}}
    ]
    assert first_apply_problems(broken, selector) == [
        "ConfigMap/elsewhere: named by the migrate Job's pod, not rendered",
        f"Secret/keel-flower: not selected by {selector!r}",
    ]


@pytest.mark.parametrize(
    "selector, labels, selected",
    [
        ("tier in (config,migrate)", {"tier": "migrate"}, True),
        ("tier in (config,migrate)", {"tier": "web"}, False),
        ("tier in (config,migrate)", {}, False),
        ("tier notin (web), app=keel", {"tier": "config", "app": "keel"}, True),
        ("tier notin (web), app=keel", {"tier": "web", "app": "keel"}, False),
        ("app!=keel", {"app": "keel"}, False),
        ("tier,!legacy", {"tier": "x"}, True),
        ("tier,!legacy", {"tier": "x", "legacy": "1"}, False),
    ],
)
def test_the_selector_reads_as_kubectl_does(selector, labels, selected):
    assert selects(selector, labels) is selected


def test_no_container_can_run_as_root(rendered):
    for name, objects in rendered.items():
        assert root_problems(objects) == [], name
        for _, spec in pod_specs(objects):
            assert spec["securityContext"]["runAsUser"] == 1000  # the image's user, keel
            assert spec["automountServiceAccountToken"] is False


def test_the_root_rule_fails_on_a_container_that_could(rendered):
    def unset_non_root(pod: dict, box: dict) -> None:
        box["securityContext"].pop("runAsNonRoot")
        pod.pop("runAsNonRoot")

    for change, expected in (
        (unset_non_root, "runAsNonRoot is not true"),
        (lambda pod, box: box["securityContext"].update(runAsUser=0), "runAsUser"),
        (
            lambda pod, box: box["securityContext"].update(allowPrivilegeEscalation=True),
            "allowPrivilegeEscalation",
        ),
    ):
        broken = copy.deepcopy(rendered["base"])
        spec = named(broken, "Deployment", "keel-web")["spec"]["template"]["spec"]
        change(spec["securityContext"], spec["containers"][0])
        problems = root_problems(broken)
        assert len(problems) == 1 and expected in problems[0], problems
    broken = copy.deepcopy(rendered["base"])
    spec = named(broken, "Job", "keel-migrate")["spec"]["template"]["spec"]
    spec["initContainers"] = [{"name": "setup", "image": "keel"}]
    assert any("Job/keel-migrate/setup" in p for p in root_problems(broken))


def test_the_root_filesystem_is_read_only_with_keels_writable_paths(rendered):
    for name, objects in rendered.items():
        assert filesystem_problems(objects) == [], name
    broken = copy.deepcopy(rendered["base"])
    spec = named(broken, "Deployment", "keel-worker")["spec"]["template"]["spec"]
    spec["containers"][0]["volumeMounts"] = []
    assert filesystem_problems(broken) == [
        "Deployment/keel-worker/worker: /var/lib/keel is not an emptyDir",
        "Deployment/keel-worker/worker: /tmp is not an emptyDir",
    ]


def test_every_container_has_resources_and_the_probes_compose_has(rendered):
    objects = rendered["base"]
    for where, spec in pod_specs(objects):
        for box in spec["containers"]:
            resources = box["resources"]
            assert {"cpu", "memory"} <= set(resources["requests"]), where
            assert "memory" in resources["limits"], where
    web = container(objects, "keel-web")
    assert web["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert web["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert web["ports"][0]["containerPort"] == 8000
    for name, role in (("keel-worker", "worker"), ("keel-beat", "beat")):
        probe = container(objects, name)["livenessProbe"]
        assert probe["exec"]["command"] == ["python", "-m", "tasks.jobs.upkeep.healthcheck", role]
        assert probe["timeoutSeconds"] >= 10  # probes.md: give it a 10 s timeout
    flower = container(objects, "keel-flower")
    assert flower["livenessProbe"]["exec"]["command"][:4] == [
        "python",
        "-m",
        "keel.flower",
        "probe",
    ]
    # The commands are compose's, service by service.
    compose = yaml.safe_load((PROJECT_ROOT / "compose.yaml").read_text())["services"]
    for service in ("web", "beat", "flower", "migrate"):
        ours = (
            named(objects, "Job", "keel-migrate")["spec"]["template"]["spec"]["containers"][0]
            if service == "migrate"
            else container(objects, f"keel-{service}")
        )
        assert ours["command"] == compose[service]["command"], service
    worker = container(objects, "keel-worker")["command"]
    assert worker[: len(compose["worker"]["command"])] == compose["worker"]["command"]


def test_pod_disruption_budgets_select_their_pods(rendered):
    objects = rendered["base"]
    for budget in (o for o in objects if o["kind"] == "PodDisruptionBudget"):
        name = budget["metadata"]["name"]
        deployment = named(objects, "Deployment", name)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
        replicas = deployment["spec"]["replicas"]
        assert budget["spec"].get("minAvailable", 0) < replicas, f"{name} blocks every drain"


def test_the_rabbitmq_overlay_sends_celerys_messages_to_rabbitmq(rendered):
    for name, scheme in (("redis", ""), ("rabbitmq", "amqp://")):
        secret = named(rendered[name], "Secret", "keel-secrets")["stringData"]
        assert secret["KEEL_BROKER_URL"].startswith(scheme), name
        assert bool(secret["KEEL_BROKER_URL"]) == bool(scheme), name
        assert secret["KEEL_REDIS_URL"].startswith("redis://"), "Redis is needed either way"


# -- a new release's pods start on its schema only -----------------------------------------

SCHEMA_USERS = ("keel-web", "keel-worker", "keel-beat")  # Flower reads Redis only


def schema_wait_problems(objects: list[dict]) -> list[str]:
    """Deployments running Keel's code that could start before the migrate Job ended."""
    found = []
    for name in SCHEMA_USERS:
        spec = named(objects, "Deployment", name)["spec"]["template"]["spec"]
        [main] = spec["containers"]
        waits = [
            box
            for box in spec.get("initContainers", [])
            if box.get("command", [])[:3] == ["keel", "db", "wait"]
            and box.get("image") == main["image"]
            and box.get("envFrom") == main["envFrom"]
        ]
        if not waits:
            found.append(f"{name} starts without waiting for its schema (keel db wait)")
    return found


def test_every_pod_on_keels_schema_waits_for_it(rendered):
    for name, objects in rendered.items():
        assert schema_wait_problems(objects) == [], name


def test_the_schema_rule_fails_on_a_deployment_that_does_not_wait(rendered):
    objects = copy.deepcopy(rendered["redis"])
    named(objects, "Deployment", "keel-worker")["spec"]["template"]["spec"]["initContainers"] = []
    assert schema_wait_problems(objects) == [
        "keel-worker starts without waiting for its schema (keel db wait)"
    ]
