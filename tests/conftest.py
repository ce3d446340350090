"""Fixtures: a real Postgres, a real Redis and real ``celery worker`` processes.

The suite is hermetic: it starts its own embedded Postgres and Redis in a
temporary ``KEEL_HOME`` (set below, before anything imports Keel), unless
``KEEL_TEST_DATABASE_URL`` / ``KEEL_TEST_REDIS_URL`` name servers to use
(the RabbitMQ tier starts its own node too, unless ``KEEL_TEST_AMQP_URL`` names one).

Two tiers, one run:
- the fast tier (``pytest -m "not stack"``): logic against the real Postgres
  and Redis, jobs run by a worker in this process (``inline_worker``), each
  module on a fresh database copied from a migrated template;
- the ``stack`` tier: whatever starts processes of its own — ``celery worker``
  subprocesses, beat, gunicorn, the sandbox, ``keel up`` — on the session's
  database. Its tests are marked automatically by the fixtures they use (or
  by ``pytestmark = pytest.mark.stack``), and run after the fast tier.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from keel.embedded import free_port

# Python's bytecode cache is on for this run and every process it starts, whatever the
# shell says (PYTHONDONTWRITEBYTECODE): each test module would be compiled and
# assert-rewritten again by each pytest process, and each worker, CLI or ``keel up`` the
# tests start would compile Keel's modules again.
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

_HOME = Path(tempfile.mkdtemp(prefix="keel-test-"))
_REDIS_PORT = free_port()
_SANDBOX_PORT = free_port()
# Celery's messages go through Redis; the RabbitMQ tier (tests/rabbitmq) sets its own.
os.environ.pop("KEEL_BROKER_URL", None)
# Traces are off unless a test turns them on for the processes it starts (tests/*/test_traces).
for _name in [name for name in os.environ if name.startswith("OTEL_")]:
    del os.environ[_name]
os.environ.update(
    KEEL_HOME=str(_HOME),
    KEEL_DATABASE_URL=os.environ.get(
        "KEEL_TEST_DATABASE_URL", f"postgresql://postgres:@/postgres?host={_HOME / 'pg'}"
    ),
    KEEL_REDIS_URL=os.environ.get("KEEL_TEST_REDIS_URL", f"redis://127.0.0.1:{_REDIS_PORT}/0"),
    KEEL_SECRET_KEY="test-secret-key-for-keel-suite-0123456789",
    KEEL_METRICS_TOKEN="test-metrics-token-0123456789abcdef",  # what tests scrape with
    KEEL_FAULT_INJECTION="1",
    KEEL_REPORT_STEP_PAUSE_MS="50",
    KEEL_PROMOTE_INTERVAL_S="0.05",
    KEEL_STALLED_INTERVAL_S="1",
    KEEL_RETENTION_INTERVAL_S="1",  # the default retention's sweep runs throughout the suite
    # Text lines (Celery's own, then Keel's fields), which tests read; the JSON lines have
    # tests of their own (tests/unit/test_logs.py, tests/acceptance/test_json_logs.py).
    KEEL_LOG_FORMAT="text",
    KEEL_VISIBILITY_TIMEOUT_S="15",
    KEEL_PROVIDER_URL=f"http://127.0.0.1:{_SANDBOX_PORT}",
    KEEL_SANDBOX_ADMIN_KEY="test-sandbox-admin-key-0123456789",
    # Webhook deliveries reach the tests' own receivers on this machine (tests/integration/
    # test_webhooks.py, which also checks that a URL outside these networks is refused),
    # and a failed one is tried again within a second, not two.
    KEEL_WEBHOOK_ALLOW="127.0.0.0/8,::1/128",
    KEEL_WEBHOOK_BACKOFF_MS="200",
)

import pytest  # noqa: E402

import tests.support.jobs  # noqa: E402,F401  (the test job types, declared as in the test worker)
from tests.support import kept_logs  # noqa: E402
from tests.support.stack import SandboxProcess, TestStack, WorkerProcess  # noqa: E402

kept_logs.watch(_HOME, "home")  # its servers' and workers' logs, if KEEL_TEST_LOG_DIR is set


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    kept_logs.configure(config)
    plugins = config.pluginmanager
    if hasattr(config.hook, "pytest_configure_node") and not plugins.hasplugin("keel-kept-logs"):
        plugins.register(kept_logs.XdistNodes(), "keel-kept-logs")  # xdist is there


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    kept_logs.finish(session.config, exitstatus)


def pytest_unconfigure(config):
    kept_logs.summary(config)  # after pytest's own summary: the run's last line
    shutil.rmtree(_HOME, ignore_errors=True)  # after its logs were kept (pytest_sessionfinish)


@pytest.fixture(scope="session")
def stack():
    """Embedded Postgres and Redis, migrated; shared by the whole session."""
    test_stack = TestStack(
        home=_HOME,
        redis_port=_REDIS_PORT,
        external_db="KEEL_TEST_DATABASE_URL" in os.environ,
        external_redis="KEEL_TEST_REDIS_URL" in os.environ,
    )
    test_stack.start()
    yield test_stack
    test_stack.stop()  # the folder goes at pytest_unconfigure, once its logs were kept


# Fixtures that start processes: a test using one belongs to the stack tier, and so
# does every test of these folders (whole stacks, chaos, served HTTP, benchmarks).
PROCESS_FIXTURES = frozenset({"worker", "sandbox", "spawn", "keel_up", "beats", "beat"})
STACK_FOLDERS = ("acceptance", "browser", "chaos", "serving", "bench", "multihost", "rabbitmq")


# Stack-tier modules outside those folders that cost seconds to collect: the fuzzer builds a
# test per operation of the served OpenAPI document when it is imported.
STACK_MODULES = frozenset({"security/test_fuzz.py"})
_TESTS = Path(__file__).parent


def _stack_deselected(config) -> bool:
    """Whether the run's ``-m`` leaves out every ``stack`` test (the fast tier's run): false
    for a ``stack`` test whatever other marks it has (``-m slow`` keeps the slow chaos tests,
    ``-m multihost`` the multihost ones). Unsure (many names, a mark's arguments, an
    expression pytest will refuse itself): collect."""
    from itertools import combinations

    from _pytest.mark.expression import Expression

    try:
        expression = Expression.compile(config.option.markexpr or "")
        others = sorted(expression.idents() - {"stack"})
        if not config.option.markexpr or len(others) > 6 or "=" in config.option.markexpr:
            return False
        marked = (
            set(chosen) | {"stack"}
            for size in range(len(others) + 1)
            for chosen in combinations(others, size)
        )
        return not any(expression.evaluate(lambda name, on=on, **_: name in on) for on in marked)
    except Exception:
        return False


def pytest_ignore_collect(collection_path, config):
    """The fast tier does not import what could only be deselected: the stack-tier folders
    and ``STACK_MODULES`` (their tests would be marked ``stack`` below)."""
    if not _stack_deselected(config):
        return None
    try:
        relative = collection_path.relative_to(_TESTS)
    except ValueError:
        return None
    if relative.parts and relative.parts[0] in STACK_FOLDERS and len(relative.parts) == 1:
        return True
    return True if relative.as_posix() in STACK_MODULES else None


def pytest_collection_modifyitems(config, items):
    """Mark the stack tier, give each fast module a fresh database, and run fast tests first."""
    for item in items:
        inside = item.path.relative_to(_TESTS).parts if item.path.is_relative_to(_TESTS) else ()
        folder = inside[0] if len(inside) > 1 else item.path.parent.name
        whole = item.path.is_relative_to(_TESTS) and (
            item.path.relative_to(_TESTS).as_posix() in STACK_MODULES
        )
        if PROCESS_FIXTURES & set(item.fixturenames) or folder in STACK_FOLDERS or whole:
            item.add_marker(pytest.mark.stack)
    modules: dict = {}
    for item in items:
        modules.setdefault(item.module, []).append(item)
    for module_items in modules.values():
        fast = not any(item.get_closest_marker("stack") for item in module_items)
        if fast and any("stack" in item.fixturenames for item in module_items):
            module_items[0].getparent(pytest.Module).add_marker("fresh_database")
    # Stable: the fast tier's order is kept, then the stack tier's. (No stack-tier worker
    # exists yet while the fast tier runs, so nothing consumes its jobs against another db.)
    items.sort(key=lambda item: item.get_closest_marker("stack") is not None)


@pytest.fixture(scope="module", autouse=True)
def module_database(request):
    """A fresh database for a fast-tier module (see ``tests.support.databases``)."""
    if request.node.get_closest_marker("fresh_database") is None:
        yield None
        return
    request.getfixturevalue("stack")
    from tests.support.databases import fresh_database

    with fresh_database() as name:
        yield name


@pytest.fixture(scope="module")
def inline_worker(stack):
    """A Celery worker in this process, for the module (``tests.support.inline``)."""
    from tests.support.inline import inline_worker as start

    with start() as running:
        yield running


@pytest.fixture(scope="session")
def worker(stack):
    """One ``celery -A tasks worker`` consuming every queue, for the session."""
    process = WorkerProcess(stack.home, "main")
    process.start()
    yield process
    process.stop()


@pytest.fixture(scope="session")
def app(stack):
    from web import create_app

    return create_app({"TESTING": True})


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture(scope="session")
def keel_up(tmp_path_factory):
    """One real ``keel up`` on a fresh home, shared by every test that does not kill it;
    it runs the README's example module too (``--include examples.hello_jobs``)."""
    from tests.support.keel_up import KeelUp

    home = tmp_path_factory.mktemp("keel-up") / "home"
    up = KeelUp(home, args=("--include", "examples.hello_jobs")).start()
    yield up
    if up.process is not None and up.process.poll() is None:
        up.stop(signal.SIGINT)


@pytest.fixture(scope="session")
def sandbox(stack):
    """The provider sandbox every worker of the session talks to (KEEL_PROVIDER_URL)."""
    process = SandboxProcess(stack.home, _SANDBOX_PORT)
    process.start()
    yield process
    process.stop()
