"""The ``keel`` command.

Subcommands import what they need when they run: ``keel --help`` and
``keel token`` must not pay for the Celery app, SQLAlchemy models or Alembic
(start-up cost, not import cycles, is why those imports sit in functions).
"""

from __future__ import annotations

import functools
import getpass
import json
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from keel.shadowing import shadowing_tasks_module

_SHADOWED = shadowing_tasks_module()
if _SHADOWED is not None:  # nothing of Keel's would import: say why, in one line
    sys.exit(f"keel: {_SHADOWED}")
# Your job modules (KEEL_JOB_MODULES) import from here, as they do in `python -m` children;
# appended, so that Keel's own packages come first.
if os.getcwd() not in sys.path and shadowing_tasks_module(Path.cwd()) is None:
    sys.path.append(os.getcwd())

from tasks.platform.config import ProcessSettings, forget_settings, get_settings  # noqa: E402

STACK_CHILDREN_CWD = Path(__file__).resolve().parents[1]  # keel.stack.PROJECT_ROOT

if TYPE_CHECKING:
    from tasks.jobs.model.models import JobRecord


# The roles a token can carry (web.auth.OPERATOR); spelled out so that `keel token` stays light.
ROLES = ("operator",)


class _Name(click.ParamType):
    """A queue, a job name or an id Keel made: no control character nor line break
    (``tasks.platform.ids``), refused in one line before anything is looked up."""

    name = "text"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from tasks.platform.ids import has_control

        if isinstance(value, str) and has_control(value):
            self.fail(f"{value!r} holds a control character or a line break", param, ctx)
        return value


class _TenantId(click.ParamType):
    """A tenant's id, by the tokens' rule (``web.tokens.ID_RULE``); empty: none given."""

    name = "tenant"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from web.tokens import ID_RULE, is_id

        if value and not is_id(value):
            self.fail(f"{value!r} is not an id ({ID_RULE})", param, ctx)
        return value


NAME, TENANT = _Name(), _TenantId()


class KeelGroup(click.Group):
    """The ``keel`` group: every error a user can cause or mend is one line, never a traceback.

    A server that cannot be reached is named with where its URL came from; a setting
    that is missing or malformed, or anything Keel refused, is said as Keel says it.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        held = next((arg for arg in args if "\x00" in arg), None)
        if held is not None:  # no program's argv can hold one, but main(args=[...]) can
            raise UsageLine(f"{held!r}: an argument cannot hold a NUL character")
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            raise UsageLine(f"{exc.format_message()} (see `keel --help`)") from None

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:  # click's own is three lines: usage, hint, error
            where = exc.ctx.command_path if exc.ctx is not None else ctx.command_path
            raise UsageLine(f"{exc.format_message()} (see `{where} --help`)") from None
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            problem = _unreachable(exc) or _misconfigured(exc)
            if problem is None:
                raise
            raise click.ClickException(problem) from None


class UsageLine(click.ClickException):
    """A usage error in one line, with click's exit code for usage errors."""

    exit_code = 2


def _misconfigured(exc: BaseException) -> str | None:
    """A setting or refusal's own words (``KeelError``), or pydantic's about a ``KEEL_*`` value."""
    from tasks.jobs.model.errors import KeelError

    if isinstance(exc, KeelError):
        return str(exc)
    pydantic = sys.modules.get("pydantic")
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        return "; ".join(_setting_problem(error) for error in exc.errors())
    return None


def _setting_problem(error: Any) -> str:
    from tasks.platform.config import PREFIX

    field = str(error["loc"][0]) if error.get("loc") else "?"
    variable = f"{PREFIX}{field.upper()}"
    message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
    return message if message.startswith(variable) else f"{variable}: {message}"


F = TypeVar("F", bound=Callable[..., Any])


def changes_state(command: F) -> F:
    """Refuse to change a stack that was only found running elsewhere, unless it was named.

    Reading a found stack is harmless and says which it used; changing one (pausing a
    queue, cancelling jobs, migrating) from an unrelated folder is a mistake waiting to
    happen, so it needs ``--home`` (or ``KEEL_HOME``).
    """

    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        choice = click.get_current_context().find_root().obj
        if getattr(choice, "how", None) == "found":
            raise click.ClickException(
                f"the stack at {choice.home} (keel up pid {choice.pid}) was found running "
                f"outside this folder; to change it from here, name it: keel --home "
                f"{choice.home} {' '.join(sys.argv[1:])}"
            )
        return command(*args, **kwargs)

    return guarded  # type: ignore[return-value]


@click.group(cls=KeelGroup)
@click.option(
    "--home",
    type=click.Path(file_okay=False, path_type=Path),
    help="the stack to use: its KEEL_HOME (default: see above)",
)
@click.option("--verbose", "-v", is_flag=True, help="show the command's log lines on stderr")
@click.version_option(package_name="keel-jobs", prog_name="keel")
@click.pass_context
def main(ctx: click.Context, home: Path | None, verbose: bool) -> None:
    """Keel: Celery jobs with BullMQ's semantics.

    Commands use the stack of --home or $KEEL_HOME if given, else of ./.keel if a
    `keel up` runs there, else the one `keel up` of yours running elsewhere (named
    on stderr; commands that change it then ask for --home); with several running,
    name one.
    """
    if home is not None:
        os.environ["KEEL_HOME"] = str(home.resolve())
        forget_settings()
    if ctx.invoked_subcommand in (None, "up") or "--help" in sys.argv[1:]:
        return  # `keel up` picks its own home; help needs no stack
    ctx.obj = _use_stack()
    from tasks.platform import logs

    # A command's output is its own: log lines only when asked, else problems alone.
    logs.configure("cli", level="INFO" if verbose else "WARNING", quiet=not verbose)


def _use_stack() -> Any:
    """Point this process at its stack (``tasks.platform.stacks``), saying so when it is not
    obvious."""
    from tasks.platform.stacks import SeveralStacks, choose

    try:
        choice = choose()
    except SeveralStacks as exc:
        raise click.ClickException(str(exc)) from None
    if choice.how == "found":
        os.environ["KEEL_HOME"] = str(choice.home)
        # The stack's job modules (`keel up --include`) import from where its children run.
        if str(STACK_CHILDREN_CWD) not in sys.path:
            sys.path.append(str(STACK_CHILDREN_CWD))
        forget_settings()
        click.echo(f"keel: {choice.describe()}", err=True)
    elif choice.stale_env is not None and _stale_values(choice.stale_env):
        click.echo(
            f"keel: no `keel up` is running on {choice.home}: using what the stopped stack left"
            f" in {choice.stale_env} ({', '.join(_stale_values(choice.stale_env))}); start it"
            " with `keel up`, or set KEEL_HOME to a running stack's home",
            err=True,
        )
    return choice


def _stale_values(env_file: Path) -> list[str]:
    """The servers and secret this process would take from ``env_file`` (the environment's win)."""
    from tasks.platform.config import read_env_file

    kept = read_env_file(env_file)
    names = ("KEEL_DATABASE_URL", "KEEL_REDIS_URL", "KEEL_SECRET_KEY")
    return [name for name in names if kept.get(name) and not os.environ.get(name)]


def _unreachable(exc: BaseException) -> str | None:
    """A server that did not answer, with its URL (password hidden) and where that came from."""
    redis_errors = sys.modules.get("redis.exceptions")
    sql_errors = sys.modules.get("sqlalchemy.exc")
    kombu_errors = sys.modules.get("kombu.exceptions")
    if redis_errors is not None and isinstance(
        exc, (redis_errors.ConnectionError, redis_errors.TimeoutError)
    ):
        return _server_problem("Redis", "KEEL_REDIS_URL", exc)
    if sql_errors is not None and isinstance(
        exc, (sql_errors.OperationalError, sql_errors.InterfaceError)
    ):
        return _server_problem("Postgres", "KEEL_DATABASE_URL", exc)
    if kombu_errors is not None and isinstance(exc, kombu_errors.OperationalError):
        broker = "KEEL_BROKER_URL" if os.environ.get("KEEL_BROKER_URL") else "KEEL_REDIS_URL"
        return _server_problem("the broker", broker, exc)
    return None


def _server_problem(server: str, variable: str, exc: BaseException) -> str:
    from tasks.platform.config import origin
    from tasks.platform.stacks import running_owner

    settings = get_settings()
    field = variable.removeprefix("KEEL_").lower()
    url = _without_password(str(getattr(settings, field, None) or "(unset)"))
    source = origin(variable)
    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    message = f"cannot reach {server} at {url} ({variable} from {source}): {why}"
    if Path(source).is_absolute() and running_owner(Path(source).parent) is None:
        message += f"; no `keel up` is running on {Path(source).parent}: start it with `keel up`"
    return message


def _without_password(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


@main.command()
@click.option(
    "--include",
    "-I",
    "includes",
    multiple=True,
    metavar="MODULE",
    help="a module of your own jobs (repeat, or comma-separate); adds to KEEL_JOB_MODULES",
)
@click.option(
    "--app",
    "celery_app",
    metavar="MODULE[:APP]",
    help="your Celery app, set up with keel.install(app) (KEEL_CELERY_APP): proj.celery:app",
)
def up(includes: tuple[str, ...], celery_app: str | None) -> None:
    """Run the whole stack (embedded Postgres and Redis unless URLs are configured)."""
    from keel import embedded
    from keel.errors import StartRefused
    from keel.stack import Stack, unimportable
    from tasks.platform import tracing
    from tasks.platform.catalog import user_job_modules
    from web.tokens import check_secret

    shadowing = shadowing_tasks_module(Path.cwd())
    if shadowing is not None:
        raise click.ClickException(shadowing)
    if includes:
        modules = user_job_modules(os.environ.get("KEEL_JOB_MODULES", ""))
        modules += [m for m in user_job_modules(",".join(includes)) if m not in modules]
        os.environ["KEEL_JOB_MODULES"] = ",".join(modules)
    # The stack's processes run in Keel's folder: your modules import from this one.
    folders = [os.getcwd(), *os.environ.get("KEEL_JOB_PATH", "").split(os.pathsep)]
    os.environ["KEEL_JOB_PATH"] = os.pathsep.join(dict.fromkeys(f for f in folders if f))
    if celery_app:  # its module imports as the job modules do, and must call keel.install
        os.environ["KEEL_CELERY_APP"] = celery_app
    app_module = (
        [os.environ["KEEL_CELERY_APP"].partition(":")[0]]
        if os.environ.get("KEEL_CELERY_APP")
        else []
    )
    problem = unimportable([*app_module, *user_job_modules(os.environ.get("KEEL_JOB_MODULES", ""))])
    if problem is not None:
        raise click.ClickException(problem)
    try:
        tracing.exporters()  # OTEL_TRACES_EXPORTER: one line now, not a traceback per child
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    settings = ProcessSettings()
    try:  # embedded servers without the [embedded] extra: one line, before anything starts
        embedded.require_unless(settings.database_url, settings.redis_url)
    except StartRefused as exc:
        raise click.ClickException(str(exc)) from None

    given = settings.secret_key
    if given is not None:  # unset: keel up generates a strong one
        try:
            check_secret(given)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from None

    sys.exit(Stack().run())


@main.command()
@click.option("--tenant", required=True)
@click.option("--user", required=True)
@click.option(
    "--role", "roles", multiple=True, type=click.Choice(ROLES), help="repeat for several roles"
)
@click.option(
    "--ttl",
    default=3600,
    show_default=True,
    type=click.IntRange(1),
    help="seconds, at most KEEL_TOKEN_MAX_TTL_S (30 days by default)",
)
def token(tenant: str, user: str, roles: tuple[str, ...], ttl: int) -> None:
    """Print a signed bearer token."""
    from web.tokens import ID_RULE, check_secret, is_id, issue_token

    settings = get_settings()
    if ttl > settings.token_max_ttl_s:
        raise click.BadParameter(f"at most {settings.token_max_ttl_s} s", param_hint="--ttl")
    for name, value in (("--tenant", tenant), ("--user", user)):
        if not is_id(value):
            raise click.BadParameter(f"{value!r} is not an id ({ID_RULE})", param_hint=name)
    if not settings.secret_key:
        from tasks.platform.config import not_configured

        raise click.ClickException(not_configured("KEEL_SECRET_KEY"))
    try:
        secret = check_secret(settings.secret_key)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(issue_token(secret, tenant, user, list(roles), ttl))


@main.command("ui-link")
@click.option("--tenant")
@click.option("--user", required=True)
@click.option(
    "--role", "roles", multiple=True, type=click.Choice(ROLES), help="repeat for several roles"
)
@click.option(
    "--platform",
    is_flag=True,
    help="the platform role: every tenant's pages, read only but for queue and key limits, "
    "each view audited (no --tenant)",
)
@click.option("--ttl", default=300, show_default=True, type=click.IntRange(1, 3600), help="seconds")
@click.option("--url", "base_url", help="where the web app answers (default: KEEL_WEB_URL)")
def ui_link(
    tenant: str | None,
    user: str,
    roles: tuple[str, ...],
    platform: bool,
    ttl: int,
    base_url: str | None,
) -> None:
    """Print a one-time sign-in link to the dashboard at /ui."""
    from web.tokens import ID_RULE, check_secret, is_id
    from web.ui.session import issue_link, issue_platform_link

    if platform and (tenant is not None or roles):
        raise click.ClickException(
            "--platform signs in to every tenant: give it without --tenant or --role"
        )
    if not platform and tenant is None:
        raise click.ClickException("give --tenant T (or --platform for every tenant's pages)")
    settings = get_settings()
    for name, value in (("--tenant", tenant), ("--user", user)):
        if value is not None and not is_id(value):
            raise click.BadParameter(f"{value!r} is not an id ({ID_RULE})", param_hint=name)
    try:
        secret = check_secret(settings.secret_key)
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    base = (base_url or settings.web_url or f"http://127.0.0.1:{settings.web_port}").rstrip("/")
    if platform:
        token = issue_platform_link(secret, user, ttl)
    else:
        token = issue_link(secret, str(tenant), user, list(roles), ttl)
    click.echo(f"{base}/ui/login/{token}")


@main.command("ui-signout")
@click.option("--tenant")
@click.option("--user", required=True)
@click.option("--platform", is_flag=True, help="the user's platform sessions (no --tenant)")
@changes_state
def ui_signout(tenant: str | None, user: str, platform: bool) -> None:
    """End every dashboard session of a user, in every browser, at once."""
    from flask import Flask

    from web.auth import EVERY_TENANT
    from web.tokens import ID_RULE, is_id
    from web.ui.session import sign_out_everywhere

    if platform == (tenant is not None):
        raise click.ClickException("give --tenant T, or --platform for platform sessions")
    for name, value in (("--tenant", tenant), ("--user", user)):
        if value is not None and not is_id(value):
            raise click.BadParameter(f"{value!r} is not an id ({ID_RULE})", param_hint=name)
    scope = EVERY_TENANT if platform else str(tenant)
    with Flask(__name__).app_context():  # the session store keeps a per-request cache in g
        ended = sign_out_everywhere(scope, user)
    whose = f"platform user {user}" if platform else f"{tenant}/{user}"
    click.echo(f"ended {ended} dashboard session{'s' if ended != 1 else ''} of {whose}")


URL_KINDS = ("web", "api", "ui", "docs", "flower", "sandbox")


@main.command("url")
@click.argument("kind", type=click.Choice(URL_KINDS), default="web")
def url_command(kind: str) -> None:
    """Print where the stack's web app (or Flower, the sandbox) answers, for scripts:
    curl "$(keel url api)/reports"."""
    settings = get_settings()
    choice = click.get_current_context().find_root().obj
    if getattr(choice, "pid", "unknown") is None:  # a reader must not take it for a live one
        click.echo(f"keel: no `keel up` is running on {choice.home}: nothing answers yet", err=True)
    web = (settings.web_url or f"http://127.0.0.1:{settings.web_port}").rstrip("/")
    urls = {
        "web": web,
        "api": f"{web}/api/v1",
        "ui": f"{web}/ui",
        "docs": f"{web}/api/v1/docs",
        "flower": f"http://127.0.0.1:{settings.flower_port}",
        "sandbox": settings.provider_url or f"http://127.0.0.1:{settings.sandbox_port}",
    }
    click.echo(urls[kind])


@main.command("env")
def env_command() -> None:
    """Print `export` lines that point a shell (and programs it starts) at this stack:
    eval "$(keel env)". Names the stack's home and addresses; no secret is printed."""
    import shlex

    settings = get_settings()
    web = (settings.web_url or f"http://127.0.0.1:{settings.web_port}").rstrip("/")
    values = {
        "KEEL_HOME": str(settings.home),
        "KEEL_WEB_URL": web,
        "KEEL_WEB_PORT": str(settings.web_port),
        "KEEL_FLOWER_PORT": str(settings.flower_port),
        "KEEL_SANDBOX_PORT": str(settings.sandbox_port),
    }
    for name, value in values.items():
        click.echo(f"export {name}={shlex.quote(value)}")


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@changes_state
def db_upgrade() -> None:
    """Alembic upgrade head."""
    from tasks.platform.migrate import migrate

    migrate()
    click.echo("database at head")


@db.command("wait")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=900.0,
    show_default=True,
    help="seconds to wait before giving up (exit 1)",
)
def db_wait(timeout: float) -> None:
    """Wait until the database's schema is at this release's head (or past it: a later
    release's), as `keel db upgrade` leaves it. For a process that must not start on an
    older schema: Kubernetes' init containers (deploy/kubernetes)."""
    from tasks.platform.migrate import wait_for_schema

    state = wait_for_schema(timeout)
    if not state.ready:
        raise click.ClickException(f"{state.said()} (waited {timeout:g} s)")
    click.echo(state.said())


@main.group("schedulers")
def schedulers_group() -> None:
    """Job schedulers (system scope unless --tenant is given)."""


@schedulers_group.command("list")
@click.option("--tenant", default="", type=TENANT, help="a tenant's schedulers (default: all)")
def schedulers_list(tenant: str) -> None:
    from tasks.jobs.schedule import schedulers
    from tasks.jobs.schedule.schedulers import Scope

    records = schedulers.list_all(Scope(tenant) if tenant else None)
    for record in records:
        described = {"tenant": record.tenant_id, **schedulers.describe(record)}
        click.echo(json.dumps(described, default=str))


@schedulers_group.command("upsert")
@click.argument("scheduler_id")
@click.option("--pattern", help="cron: 5 fields, or 6 with seconds first")
@click.option("--every", type=click.IntRange(100), help="period in milliseconds")
@click.option("--tz", default="UTC", show_default=True)
@click.option("--immediately", is_flag=True)
@click.option("--limit", type=click.IntRange(1))
@click.option("--name", "job_name", required=True, type=NAME, help="job name, e.g. reports.cleanup")
@click.option("--data", default="{}", help="job data as JSON")
@click.option("--opts", default="{}", help="job options as JSON (attempts, backoff, ...)")
@click.option("--queue", type=NAME, help="default: the queue the job's handler is registered on")
@click.option("--tenant", default="", help="the tenant that owns it (default: the system)")
@click.option("--user", help="with --tenant: the user its jobs belong to")
@click.option(
    "--overlap",
    type=click.Choice(["allow", "skip", "buffer", "cancel"]),
    help="while its last job is live: add anyway (default), skip, hold one, cancel it",
)
@click.option(
    "--catch-up",
    type=click.Choice(["earliest", "latest", "all"]),
    help="slots missed while no beat ran: fire the first (default), the last, or each"
    " (all: with --catch-up-window)",
)
@click.option("--catch-up-window", type=click.IntRange(1000), help="ms: older slots never fire")
@click.option("--jitter", type=click.IntRange(0), help="ms: each job starts up to this late")
@click.option("--paused/--not-paused", default=None, help="default: as it was (new: not paused)")
@changes_state
def schedulers_upsert(
    scheduler_id: str,
    pattern: str | None,
    every: int | None,
    tz: str,
    immediately: bool,
    limit: int | None,
    job_name: str,
    data: str,
    opts: str,
    queue: str | None,
    tenant: str,
    user: str | None,
    overlap: str | None,
    catch_up: str | None,
    catch_up_window: int | None,
    jitter: int | None,
    paused: bool | None,
) -> None:
    """Create or update SCHEDULER_ID.

    A tenant's scheduler (--tenant, --user) follows the API's rules: only jobs
    tenants may schedule, identity from --tenant/--user, the tenant's quotas.
    """
    from pydantic import ValidationError

    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.model.errors import KeelError
    from tasks.jobs.schedule import schedulers
    from tasks.jobs.schedule.schedulers import SchedulerSpec, Scope
    from tasks.platform import quotas
    from web.tokens import ID_RULE, is_id

    if bool(tenant) != bool(user):
        raise click.UsageError("--tenant and --user go together (a tenant's jobs need a user)")
    if catch_up == "all" and catch_up_window is None:
        raise click.UsageError(
            "--catch-up all needs --catch-up-window (ms: older missed slots never fire)"
        )
    for name, value in (("--tenant", tenant), ("--user", user)):
        if value and not is_id(value):
            raise click.BadParameter(f"{value!r} is not an id ({ID_RULE})", param_hint=name)
    raw = {
        "pattern": pattern,
        "every": every,
        "tz": tz,
        "immediately": immediately,
        "limit": limit,
        "overlap": overlap,
        "catchUp": catch_up,
        "catchUpWindow": catch_up_window,
        "jitter": jitter,
        "paused": paused,
        "template": {
            "name": job_name,
            "data": _json_option("--data", data),
            "opts": _json_option("--opts", opts),
        },
    }
    load_job_modules()
    try:
        spec = SchedulerSpec.model_validate({k: v for k, v in raw.items() if v is not None})
        quota = quotas.current().scheduling if tenant else None
        record = schedulers.upsert(
            Scope(tenant, user or "cli"), scheduler_id, spec, queue=queue, quota=quota
        )
    except (ValidationError, KeelError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(schedulers.describe(record), default=str))


def _json_option(name: str, raw: str) -> dict:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint=name) from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint=name)
    return value


@schedulers_group.command("remove")
@click.argument("scheduler_id")
@click.option("--tenant", default="", type=TENANT)
@changes_state
def schedulers_remove(scheduler_id: str, tenant: str) -> None:
    """Remove SCHEDULER_ID: no further jobs are created."""
    from tasks.jobs.model.errors import JobNotFound
    from tasks.jobs.schedule import schedulers
    from tasks.jobs.schedule.schedulers import Scope

    try:
        schedulers.remove(Scope(tenant), scheduler_id)
    except JobNotFound:
        raise click.ClickException(_no_scheduler(scheduler_id, tenant)) from None
    click.echo(f"removed {scheduler_id}")


@schedulers_group.command("pause")
@click.argument("scheduler_id")
@click.option("--tenant", default="", type=TENANT)
@changes_state
def schedulers_pause(scheduler_id: str, tenant: str) -> None:
    """Pause SCHEDULER_ID: no fire until it is resumed."""
    _set_paused(scheduler_id, tenant, True)


@schedulers_group.command("resume")
@click.argument("scheduler_id")
@click.option("--tenant", default="", type=TENANT)
@changes_state
def schedulers_resume(scheduler_id: str, tenant: str) -> None:
    """Resume SCHEDULER_ID: it fires at its next slot after now (missed ones are not)."""
    _set_paused(scheduler_id, tenant, False)


def _set_paused(scheduler_id: str, tenant: str, paused: bool) -> None:
    from tasks.jobs.model.errors import JobNotFound
    from tasks.jobs.schedule import schedulers
    from tasks.jobs.schedule.schedulers import Scope

    try:
        record = schedulers.set_paused(Scope(tenant), scheduler_id, paused)
    except JobNotFound:
        raise click.ClickException(_no_scheduler(scheduler_id, tenant)) from None
    click.echo(json.dumps(schedulers.describe(record), default=str))


@schedulers_group.command("trigger")
@click.argument("scheduler_id")
@click.option("--tenant", default="", type=TENANT)
@changes_state
def schedulers_trigger(scheduler_id: str, tenant: str) -> None:
    """Run SCHEDULER_ID now (paused or not), under its overlap policy; its next slot stays."""
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.model.errors import JobNotFound, KeelError
    from tasks.jobs.schedule import firing
    from tasks.jobs.schedule.schedulers import Scope
    from tasks.platform import quotas

    load_job_modules()
    limits = quotas.current().jobs if tenant else None
    try:
        fired = firing.trigger(Scope(tenant), scheduler_id, limits)
    except JobNotFound:
        raise click.ClickException(_no_scheduler(scheduler_id, tenant)) from None
    except KeelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps({"outcome": fired.outcome, "jobId": fired.job_id}))


def _no_scheduler(scheduler_id: str, tenant: str) -> str:
    """That there is none in this scope, and the --tenant of the ones there are."""
    from tasks.jobs.schedule import schedulers

    scope = f"tenant {tenant}" if tenant else "the system scope"
    owners = sorted(
        r.tenant_id for r in schedulers.list_all() if r.id == scheduler_id and r.tenant_id
    )
    found = [o for o in owners if o != tenant]
    if not found:
        return f"no scheduler {scheduler_id!r} in {scope}"
    hint = " or ".join(f"--tenant {owner}" for owner in found[:5])
    return f"no scheduler {scheduler_id!r} in {scope}; it is a tenant's: add {hint}"


@main.group("jobs")
def jobs_group() -> None:
    """Job records of every tenant and the system (the system scope)."""


def _job_line(job: JobRecord) -> str:
    from tasks.jobs.observe.queries import describe_full

    return json.dumps({**describe_full(job), "tenantId": job.tenant_id}, default=str)


# What the search's time options take: ISO 8601, read as UTC unless they carry an offset.
TIMES = ("%Y-%m-%d", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%d %H:%M:%S")


def _utc(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


# The job states (``tasks.jobs.model.models.State``), spelled out: importing the models would
# make every ``keel`` command pay for SQLAlchemy.
JOB_STATES = (
    "waiting",
    "active",
    "delayed",
    "completed",
    "failed",
    "waiting-children",
    "cancelled",
)


@jobs_group.command("list")
@click.option("--queue", type=NAME)
@click.option("--state", type=click.Choice(JOB_STATES))
@click.option("--name", "job_name", type=NAME, help="job name, e.g. report.generate")
@click.option(
    "--tenant", type=TENANT, help="one tenant's jobs (default: every tenant's and the system's)"
)
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="quiet periodic system jobs too (campaign.monitor every 10 s; left out by default)",
)
@click.option(
    "--data",
    "data_search",
    help="jobs whose data contain this: path=value terms separated by spaces "
    '(customerId=42 customer.region=eu-west-1; 42 matches 42 and "42"), or a JSON object',
)
@click.option("--id-prefix", help="jobs whose id starts with this")
@click.option("--created-from", type=click.DateTime(TIMES), help="added at or after (UTC)")
@click.option("--created-to", type=click.DateTime(TIMES), help="added at or before (UTC)")
@click.option("--finished-from", type=click.DateTime(TIMES), help="ended at or after (UTC)")
@click.option("--finished-to", type=click.DateTime(TIMES), help="ended at or before (UTC)")
@click.option("--error", help="jobs whose failed reason contains this text, in any case")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 100))
@click.option("--cursor", help="the cursor printed after the previous page")
def jobs_list(
    queue: str | None,
    state: str | None,
    job_name: str | None,
    tenant: str | None,
    show_all: bool,
    data_search: str | None,
    id_prefix: str | None,
    created_from: datetime | None,
    created_to: datetime | None,
    finished_from: datetime | None,
    finished_to: datetime | None,
    error: str | None,
    limit: int,
    cursor: str | None,
) -> None:
    """Print jobs as JSON lines, newest first; the next page's cursor goes to stderr.

    Quiet periodic system jobs (handler(..., quiet=True): campaign.monitor) are
    left out unless --all is given or --name names them. The search options
    (--data, --id-prefix, --created-*, --finished-*, --error) are those of
    GET /api/v1/jobs; every one given holds.
    """
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.model.search import SearchRefused, parse
    from tasks.jobs.observe import quiet
    from tasks.jobs.observe.queries import InvalidCursor, JobFilter, list_jobs

    try:
        load_job_modules()  # every job type declared, the quiet ones among them
    except ImportError as exc:  # listing needs none of them: say so, and go on
        click.echo(f"keel: job modules not loaded ({exc}); --all may be needed", err=True)
    hidden = () if show_all or job_name else quiet.names()
    try:
        data = parse(data_search) if data_search is not None else ()
    except SearchRefused as exc:
        raise click.BadParameter(str(exc), param_hint="--data") from None
    where = JobFilter(
        tenant_id=tenant,
        queue=queue,
        state=state,
        name=job_name,
        hidden_names=hidden,
        id_prefix=id_prefix,
        data=data,
        created_from=_utc(created_from),
        created_to=_utc(created_to),
        finished_from=_utc(finished_from),
        finished_to=_utc(finished_to),
        error=error,
    )
    try:
        page = list_jobs(where, cursor=cursor, limit=limit)
    except InvalidCursor as exc:
        raise click.BadParameter(str(exc), param_hint="--cursor") from None
    for job in page.jobs:
        click.echo(_job_line(job))
    if page.next_cursor is not None:
        click.echo(f"next: --cursor {page.next_cursor}", err=True)


@jobs_group.command("show")
@click.argument("job_id")
def jobs_show(job_id: str) -> None:
    """Print one job (any tenant's) as JSON."""
    from tasks.jobs.observe.queries import get

    job = get(job_id)
    if job is None:
        raise click.ClickException(f"no job {job_id!r}")
    click.echo(_job_line(job))


@jobs_group.command("cancel")
@click.argument("job_id")
@click.option("--reason", default=None, help="why (kept in the audit of an abort)")
@click.option("--by", "actor", default="system", show_default=True, help="who (audit)")
@changes_state
def jobs_cancel(job_id: str, reason: str | None, actor: str) -> None:
    """Cancel a waiting or delayed job (it never runs), or abort an active one: it ends
    cancelled once its run stops (stopped by its worker past KEEL_ABORT_GRACE_S)."""
    from tasks.jobs.end.cancel import cancel
    from tasks.jobs.model.errors import KeelError

    try:
        done = cancel(job_id, None, actor=actor, reason=reason)
    except KeelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(_job_line(done.job))  # aborting: still active, with abortRequestedAt


@jobs_group.command("retry")
@click.argument("job_id")
@click.option("--reason", required=True, help="why (kept in the audit trail; 10+ characters)")
@click.option("--by", "actor", required=True, help="who is retrying (kept in the audit trail)")
@click.option("--cancelled", "cancelled_too", is_flag=True, help="retry a cancelled job too")
@changes_state
def jobs_retry(job_id: str, reason: str, actor: str, cancelled_too: bool) -> None:
    """Give a failed job (with --cancelled, a cancelled one) its full attempts again,
    audited first (as the API's retry)."""
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.intake.manual_retry import RetryRequest, retry
    from tasks.jobs.model.errors import KeelError

    if not 10 <= len(reason) <= 2000:
        raise click.BadParameter("10 to 2000 characters", param_hint="--reason")
    load_job_modules()  # every job type's retry rules declared
    try:
        retry(
            RetryRequest(
                job_id=job_id,
                queue=None,
                owner=None,
                actor=actor,
                reason=reason,
                cancelled_too=cancelled_too,
            )
        )
    except KeelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"retrying {job_id}")


BULK_ACTIONS = ("retry", "cancel", "promote", "clean", "drain", "obliterate")


@jobs_group.command("bulk")
@click.argument("action", type=click.Choice(BULK_ACTIONS))
@click.option("--queue", type=NAME)
@click.option("--name", "job_name", type=NAME, help="job name, e.g. report.generate")
@click.option("--state", "states", multiple=True, type=click.Choice(JOB_STATES))
@click.option(
    "--tenant", type=TENANT, help="one tenant's jobs (default: every tenant's and the system's)"
)
@click.option("--created-after", type=click.DateTime(), help="UTC")
@click.option("--created-before", type=click.DateTime(), help="UTC")
@click.option(
    "--older-than",
    "older_than_s",
    type=click.FloatRange(0),
    help="clean: only records finished more than this many seconds ago",
)
@click.option("--reason", required=True, help="why (kept in the audit; 10+ characters)")
@click.option("--by", "actor", required=True, help="who (kept in the audit)")
@click.option("--yes", is_flag=True, help="do not ask to confirm the count")
@changes_state
def jobs_bulk(
    action: str,
    queue: str | None,
    job_name: str | None,
    states: tuple[str, ...],
    tenant: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    older_than_s: float | None,
    reason: str,
    actor: str,
    yes: bool,
) -> None:
    """Act on every job a filter matches: retry failed ones, cancel waiting/delayed ones,
    promote delayed ones, clean finished records, drain a queue, obliterate a paused queue.

    Says how many jobs match and asks to confirm, then works the action in batches here,
    printing its progress (a worker goes on with it if this stops), and prints it as JSON.
    """
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.model.errors import KeelError
    from tasks.jobs.model.models import State
    from tasks.jobs.upkeep import bulk_actions
    from tasks.jobs.upkeep.bulk_actions import BulkFilter

    load_job_modules()  # every job type's retry rules declared (a bulk retry leaves them out)
    if not 10 <= len(reason) <= 2000:
        raise click.BadParameter("10 to 2000 characters", param_hint="--reason")
    finished_before = None
    if older_than_s is not None:
        finished_before = datetime.now(UTC) - timedelta(seconds=older_than_s)
    asked = bulk_actions.Asked(
        action=action,
        filter=BulkFilter(
            states=tuple(State(s) for s in dict.fromkeys(states)),
            queue=queue,
            name=job_name,
            tenant_id=tenant,
            created_after=created_after.replace(tzinfo=UTC) if created_after else None,
            created_before=created_before.replace(tzinfo=UTC) if created_before else None,
            finished_before=finished_before,
        ),
        actor=actor,
        reason=reason,
    )
    try:
        matched = bulk_actions.preview(asked, system=True)
        click.echo(f"{action}: {matched} jobs match", err=True)
        if matched == 0:
            return  # nothing to do, and nothing recorded
        if not yes:
            click.confirm(f"{action} them?", abort=True, err=True)
        row = bulk_actions.start(asked, system=True)
        row = bulk_actions.work_to_end(
            row.id, lambda r: click.echo(f"{r.done} of {r.matched} done", err=True)
        )
    except KeelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(bulk_actions.describe(row), default=str))


@jobs_group.command("republish")
@click.option(
    "--queue", default=None, type=NAME, help="one queue (default: every queue with waiting jobs)"
)
@click.option(
    "--older-than",
    "older_than_s",
    default=10.0,
    show_default=True,
    type=click.FloatRange(0),
    help="seconds since a job was last published",
)
@changes_state
def jobs_republish(queue: str | None, older_than_s: float) -> None:
    """Republish waiting jobs whose message the broker no longer holds (after a purge)."""
    from tasks.jobs.model.errors import KeelError
    from tasks.jobs.upkeep.reconcile import republish_lost

    try:
        count = republish_lost(queue, older_than_s=older_than_s)
    except KeelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"republished {count} job(s)")


@main.command("provider-sandbox", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def provider_sandbox(args: tuple[str, ...]) -> None:
    """Run the provider sandbox (--host, --port, --home) with this stack's settings.

    The sandbox reads its own environment (it imports nothing of Keel); the
    stack's values from ``$KEEL_HOME/env`` fill in what the environment lacks.
    """
    from keel import extras

    if not extras.installed(extras.SANDBOX):
        raise click.ClickException(
            f"the provider sandbox is not installed: {extras.SANDBOX_INSTALL}"
        )
    from provider_sandbox.__main__ import main as sandbox_main

    settings = get_settings()
    for name, value in (
        ("KEEL_SANDBOX_PORT", str(settings.sandbox_port)),
        ("KEEL_SANDBOX_HOME", str(settings.home / "sandbox")),
        ("KEEL_SANDBOX_ADMIN_KEY", settings.sandbox_admin_key),
    ):
        os.environ.setdefault(name, value)
    sys.exit(sandbox_main(list(args)))


@main.group("campaign")
def campaign_group() -> None:
    """Notification campaigns."""


@campaign_group.command("verify")
@click.argument("campaign_id", type=NAME)
def campaign_verify(campaign_id: str) -> None:
    """Check the four group-send invariants against the provider's ledger."""
    from tasks.notifications.verify import verify

    checks = verify(campaign_id)
    for check in checks:
        click.echo(f"{'PASS' if check.ok else 'FAIL'}  {check.name}  {json.dumps(check.figures)}")
    if not all(check.ok for check in checks):
        sys.exit(1)


@main.command("events")
@click.option(
    "--queue", "queues", multiple=True, type=NAME, help="repeat for several (default: every queue)"
)
@click.option("--follow", "-f", is_flag=True, help="keep printing events as they are written")
@click.option("--since", help="stream id to start after; '$' = now (default: 0, or now with -f)")
@click.option("--tenant", type=NAME, help="one tenant's jobs only (their events name it)")
def events_command(
    queues: tuple[str, ...], follow: bool, since: str | None, tenant: str | None
) -> None:
    """Print queue events as JSON lines, whichever process wrote them."""
    from tasks.celeryconfig import QUEUES
    from tasks.jobs.observe import events

    chosen = list(queues) or list(QUEUES)
    start = since or ("$" if follow else "0")
    if start == "$":
        start = _stream_id_now()
    click.echo(f"keel: events of {', '.join(chosen)} after {start}", err=True)
    try:
        for event in events.read(chosen, since=start, follow=follow):
            if tenant is None or event.get("tenant") == tenant:
                click.echo(json.dumps(event))
    except KeyboardInterrupt:
        pass


def _stream_id_now() -> str:
    """A concrete id for "now": ``$`` would skip events written between two reads."""
    from tasks.platform.broker import redis_client

    seconds, micros = redis_client().time()
    return str(seconds * 1000 + micros // 1000 - 1)


@main.group("queues")
def queues_group() -> None:
    """Pause and resume queues (the system scope: every tenant's jobs, or one tenant's), and
    change their limits live."""


def _queue_known(queue: str) -> None:
    from tasks.jobs.calls.loading import known_queues, load_job_modules

    load_job_modules()
    if queue not in known_queues():
        raise click.BadParameter(
            f"no job type runs on queue {queue!r} (known: {', '.join(known_queues())})",
            param_hint="QUEUE",
        )


@queues_group.command("pause")
@click.argument("queue", type=NAME)
@click.option(
    "--tenant", default="", type=TENANT, help="hold one tenant's jobs only (default: everyone's)"
)
@changes_state
def queues_pause(queue: str, tenant: str) -> None:
    """Pause QUEUE: jobs added meanwhile are recorded and wait, running jobs finish.

    Every worker honours it within a second, and it outlasts restarts of every process.
    """
    from tasks.jobs.intake import pauses

    _queue_known(queue)
    changed = pauses.pause(queue, tenant, by=f"cli:{getpass.getuser()}")
    scope = f"tenant {tenant}'s jobs" if tenant else "every tenant's jobs"
    click.echo(f"queue {queue} {'paused' if changed else 'was paused already'} for {scope}")


@queues_group.command("resume")
@click.argument("queue", type=NAME)
@click.option(
    "--tenant",
    default="",
    type=TENANT,
    help="the pause of one tenant's jobs (default: the queue's)",
)
@changes_state
def queues_resume(queue: str, tenant: str) -> None:
    """Resume QUEUE: the jobs its pause held are published again, in the order they came."""
    from tasks.jobs.intake import pauses

    resumed = pauses.resume(queue, tenant, by=f"cli:{getpass.getuser()}")
    scope = f"tenant {tenant}'s jobs" if tenant else "every tenant's jobs"
    if not resumed.lifted:
        _queue_known(queue)  # only now: a queue no job type runs on any more can be resumed
        click.echo(f"queue {queue} was not paused for {scope}")
        return
    click.echo(f"queue {queue} resumed for {scope}: {resumed.released} held jobs published again")


@queues_group.command("paused")
def queues_paused() -> None:
    """Print the pauses in force as JSON lines (tenantId "" pauses every tenant's jobs)."""
    from tasks.jobs.intake import pauses
    from tasks.jobs.observe.queries import iso

    for pause in pauses.paused():
        line = {
            "queue": pause.queue,
            "tenantId": pause.tenant_id,
            "pausedBy": pause.paused_by,
            "pausedAt": iso(pause.paused_at),
        }
        click.echo(json.dumps(line))


@queues_group.group("limits")
def queue_limits_group() -> None:
    """Queue limits set live (concurrency, rate): in force on every worker within a second,
    no restart; KEEL_QUEUE_LIMITS stays each queue's default. Every change is audited."""


@queue_limits_group.command("list")
def queue_limits_list() -> None:
    """Print every queue's limits as JSON lines: in force, default, set live (by, when, why)."""
    from tasks.jobs.run import live_limits

    for limits in live_limits.shown():
        click.echo(json.dumps(live_limits.to_json(limits)))


@queue_limits_group.command("show")
@click.argument("queue", type=NAME)
@click.option("--changes", default=20, show_default=True, type=click.IntRange(0, 1000))
def queue_limits_show(queue: str, changes: int) -> None:
    """Print QUEUE's limits, then its newest changes, as JSON lines."""
    from tasks.jobs.run import live_limits

    click.echo(json.dumps(live_limits.to_json(live_limits.of(queue))))
    for change in live_limits.history(queue, changes):
        click.echo(json.dumps(live_limits.change_json(change)))


def _limit_value(raw: str | None, param: str, parse: Callable[[str], Any]) -> Any:
    if raw is None or raw == "none":
        return None
    try:
        return parse(raw)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=param) from None


def _rate(raw: str) -> Any:
    from tasks.platform.setting_types import Rate

    most, _, per_ms = raw.partition("/")
    return Rate(max=int(most), duration_ms=int(per_ms))


@queue_limits_group.command("set")
@click.argument("queue", type=NAME)
@click.option("--concurrency", help="jobs running at once; 'none': no limit")
@click.option("--rate", help="MAX/MS: at most MAX starts per MS milliseconds; 'none': no limit")
@click.option("--reason", required=True, help="why (kept in the audit; 10+ characters)")
@click.option("--by", "actor", help="who (kept in the audit; default: cli:<your login>)")
@changes_state
def queue_limits_set(
    queue: str, concurrency: str | None, rate: str | None, reason: str, actor: str | None
) -> None:
    """Set QUEUE's limits live; an option left out keeps the KEEL_QUEUE_LIMITS default.

    Running jobs are not stopped: a lower concurrency refuses new starts until fewer run.
    """
    from pydantic import ValidationError

    from tasks.jobs.run import live_limits

    if not 10 <= len(reason) <= 2000:
        raise click.BadParameter("10 to 2000 characters", param_hint="--reason")
    given = {name for name, raw in (("concurrency", concurrency), ("rate", rate)) if raw}
    if not given:
        raise click.UsageError("give --concurrency or --rate (or both)")
    try:
        override = live_limits.stored(
            _limit_value(concurrency, "--concurrency", int),
            _limit_value(rate, "--rate", _rate),
            given,
        )
    except (ValueError, ValidationError) as exc:
        raise click.BadParameter(
            str(exc).splitlines()[-1], param_hint="--concurrency/--rate"
        ) from None
    live_limits.set_limits(queue, override, actor or f"cli:{getpass.getuser()}", reason)
    click.echo(json.dumps(live_limits.to_json(live_limits.of(queue))))


@queue_limits_group.command("clear")
@click.argument("queue", type=NAME)
@click.option("--reason", required=True, help="why (kept in the audit; 10+ characters)")
@click.option("--by", "actor", help="who (kept in the audit; default: cli:<your login>)")
@changes_state
def queue_limits_clear(queue: str, reason: str, actor: str | None) -> None:
    """Clear QUEUE's limits set live: its KEEL_QUEUE_LIMITS default is in force again."""
    from tasks.jobs.run import live_limits

    if not 10 <= len(reason) <= 2000:
        raise click.BadParameter("10 to 2000 characters", param_hint="--reason")
    change = live_limits.clear_limits(queue, actor or f"cli:{getpass.getuser()}", reason)
    if change is None:
        click.echo(f"queue {queue} had no limits set live", err=True)
    click.echo(json.dumps(live_limits.to_json(live_limits.of(queue))))


@main.group("limits")
def limits_group() -> None:
    """Limits changed live (a queue's: keel queues limits)."""


@limits_group.group("keys")
def key_limits_group() -> None:
    """A job type's key limits (max_running, rate) overridden live, for one tenant's keys or
    any tenant's (*), one key or a pattern (partner-*): in force on every worker within a
    second, no restart. The most specific override of a key wins. Every change is audited."""


def _key_tenant(ctx: click.Context, param: click.Parameter, value: str) -> str:
    return value if value == "*" else TENANT.convert(value, param, ctx)


KEY_TENANT = click.option(
    "--tenant",
    default="*",
    show_default=True,
    callback=_key_tenant,
    help="the tenant whose keys; *: any tenant's",
)
KEY_PATTERN = click.option(
    "--key", "key", required=True, type=NAME, help="a key, or a pattern where * is any run"
)


def _reason(reason: str) -> None:
    if not 10 <= len(reason) <= 2000:
        raise click.BadParameter("10 to 2000 characters", param_hint="--reason")


@key_limits_group.command("list")
def key_limits_list() -> None:
    """Print every job type's key limits as JSON lines: declared, and overridden (by, why)."""
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.run import live_key_limits

    load_job_modules()
    for limits in live_key_limits.shown():
        click.echo(json.dumps(live_key_limits.to_json(limits)))


@key_limits_group.command("show")
@click.argument("name", type=NAME)
@click.option("--key", type=NAME, help="also print what holds for this key (and --tenant)")
@click.option("--tenant", callback=lambda c, p, v: v and _key_tenant(c, p, v), help="with --key")
@click.option("--changes", default=20, show_default=True, type=click.IntRange(0, 1000))
def key_limits_show(name: str, key: str | None, tenant: str | None, changes: int) -> None:
    """Print NAME's key limits, what holds for --key, then its newest changes, as JSON lines."""
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.run import live_key_limits

    load_job_modules()
    try:
        limits = live_key_limits.of(name)
    except live_key_limits.UnknownJobType as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    click.echo(json.dumps(live_key_limits.to_json(limits)))
    if key is not None:
        given = None if tenant in (None, "*") else tenant
        click.echo(json.dumps({"inForce": live_key_limits.in_force(limits, given, key)}))
    for change in live_key_limits.history(name, changes):
        click.echo(json.dumps(live_key_limits.change_json(change)))


@key_limits_group.command("set")
@click.argument("name", type=NAME)
@KEY_TENANT
@KEY_PATTERN
@click.option("--max-running", help="jobs of one key running at once; 'none': no limit")
@click.option("--rate", help="MAX/MS: at most MAX starts per MS milliseconds; 'none': no limit")
@click.option("--reason", required=True, help="why (kept in the audit; 10+ characters)")
@click.option("--by", "actor", help="who (kept in the audit; default: cli:<your login>)")
@changes_state
def key_limits_set(
    name: str,
    tenant: str,
    key: str,
    max_running: str | None,
    rate: str | None,
    reason: str,
    actor: str | None,
) -> None:
    """Override NAME's key limits for the keys --key names (of --tenant); an option left out
    is decided by a less specific override or the declaration.

    Running jobs are not stopped: a lower max-running refuses new starts until fewer run.
    """
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.run import live_key_limits

    _reason(reason)
    problem = live_key_limits.pattern_problem(key)
    if problem:
        raise click.BadParameter(problem, param_hint="--key")
    given: dict[str, Any] = {}
    if max_running:
        given["max_running"] = _limit_value(max_running, "--max-running", int)
    if rate:
        found = _limit_value(rate, "--rate", _rate)
        given["rate"] = found and {"max": found.max, "per_ms": found.duration_ms}
    if not given:
        raise click.UsageError("give --max-running or --rate (or both)")
    load_job_modules()
    by = actor or f"cli:{getpass.getuser()}"
    try:
        live_key_limits.set_override(name, tenant, key, given, by, reason)
    except live_key_limits.UnknownJobType as exc:
        raise click.BadParameter(str(exc), param_hint="NAME") from None
    except live_key_limits.OverrideRefused as exc:
        hint = "--rate" if exc.field.startswith("rate") else "--max-running"
        raise click.BadParameter(exc.message, param_hint=hint) from None
    click.echo(json.dumps(live_key_limits.to_json(live_key_limits.of(name))))


@key_limits_group.command("clear")
@click.argument("name", type=NAME)
@KEY_TENANT
@KEY_PATTERN
@click.option("--reason", required=True, help="why (kept in the audit; 10+ characters)")
@click.option("--by", "actor", help="who (kept in the audit; default: cli:<your login>)")
@changes_state
def key_limits_clear(name: str, tenant: str, key: str, reason: str, actor: str | None) -> None:
    """Clear one override of NAME's key limits (--tenant and --key as set)."""
    from tasks.jobs.calls.loading import load_job_modules
    from tasks.jobs.run import live_key_limits

    _reason(reason)
    load_job_modules()
    by = actor or f"cli:{getpass.getuser()}"
    change = live_key_limits.clear_override(name, tenant, key, by, reason)
    if change is None:
        click.echo(f"{name} had no override for tenant {tenant}, key {key}", err=True)
    found = live_key_limits.shown(name)
    click.echo(json.dumps(live_key_limits.to_json(found[0]) if found else {"name": name}))


@main.group("deadletters")
def deadletters_group() -> None:
    """Broker items no worker could read, set aside per queue."""


@deadletters_group.command("list")
@click.option(
    "--queue", "queues", multiple=True, type=NAME, help="repeat for several (default: every queue)"
)
def deadletters_list(queues: tuple[str, ...]) -> None:
    """Print dead letters as JSON lines, newest first."""
    from tasks.platform import deadletters
    from tasks.platform.broker import redis_client

    client = redis_client()
    for queue in queues or deadletters.queues(client):
        for _, letter in deadletters.entries(client, queue):
            click.echo(letter.to_json())


@deadletters_group.command("drop")
@click.argument("ids", nargs=-1, type=NAME)
@click.option(
    "--queue", "queues", multiple=True, type=NAME, help="repeat for several (default: every queue)"
)
@click.option("--all", "drop_all", is_flag=True, help="every dead letter of the queues")
@changes_state
def deadletters_drop(ids: tuple[str, ...], queues: tuple[str, ...], drop_all: bool) -> None:
    """Delete the dead letters named by IDS (or --all of them)."""
    from tasks.platform import deadletters
    from tasks.platform.broker import redis_client

    if bool(ids) == drop_all:
        raise click.UsageError("give either dead letter IDS or --all")
    client = redis_client()
    chosen = None if drop_all else set(ids)
    dropped = []
    for queue in queues or deadletters.queues(client):
        dropped += deadletters.drop(client, queue, chosen)
    for missing in sorted((chosen or set()) - set(dropped)):
        click.echo(f"no dead letter {missing}", err=True)
    click.echo(f"dropped {len(dropped)}")
    if chosen and len(dropped) < len(chosen):
        sys.exit(1)


@main.command("status")
@click.option("--json", "as_json", is_flag=True, help="one JSON document instead of lines")
def status(as_json: bool) -> None:
    """The whole system's health: servers, workers, beat, dead letters, overdue delayed jobs.

    Exits 0 when every check passes, 1 otherwise (for scripts and monitors).
    """
    from tasks import health

    checks = health.system()
    healthy = all(check.ok for check in checks)
    if as_json:
        found = {c.name: {"ok": c.ok, "found": c.found, "problem": c.problem} for c in checks}
        click.echo(json.dumps({"healthy": healthy, "checks": found}))
    else:
        for check in checks:
            click.echo(f"{'ok  ' if check.ok else 'FAIL'}  {check.name:<16} {check.describe()}")
        click.echo("healthy" if healthy else "unhealthy")
    if not healthy:
        sys.exit(1)


@main.group("audit")
def audit_group() -> None:
    """Audit trails that belong to no job: what the dashboard's platform sessions read."""


@audit_group.command("views")
@click.option("--user", type=TENANT, help="only this platform user's views")
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10000))
def audit_views(user: str | None, limit: int) -> None:
    """Print the pages platform sessions (keel ui-link --platform) read, newest first, as JSON
    lines: who, which view, the path with its query, when."""
    from tasks.jobs.observe import platform_views

    for view in platform_views.newest(user, limit):
        click.echo(json.dumps(view.to_json()))
