"""Keel's settings, read from the environment and from ``$KEEL_HOME/env``.

``keel up`` writes the effective values of a running stack to
``$KEEL_HOME/env`` so that every other ``keel`` command, worker or script
finds the same servers without being told. Variables set in the process
environment always win over that file.
"""

from __future__ import annotations

import os
import re
import shlex
import threading
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from tasks.platform.errors import KeelError
from tasks.platform.redis_url import RedisTarget, parse
from tasks.platform.setting_types import (
    QueueLimit,
    TenantQuotas,
    parse_networks,
    parse_queue_limits,
    parse_tenant_quotas,
)
from tasks.platform.stacks import ENV_FILE_NAME, keel_home, settings_home

PREFIX = "KEEL_"
SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")  # KEEL_DATABASE_SCHEMA


def read_env_file(path: Path) -> dict[str, str]:
    """Parse shell ``KEY=VALUE`` lines (the format ``keel up`` writes)."""
    values: dict[str, str] = {}
    if not path.is_file():
        return values
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, raw = line.partition("=")
        parts = shlex.split(raw) if raw else [""]
        values[key.strip()] = parts[0] if parts else ""
    return values


def origin(variable: str) -> str:
    """Where this process's ``variable`` comes from: the environment, or the env file's path.

    Named in errors, so that a URL left in an old ``$KEEL_HOME/env`` is found.
    """
    if os.environ.get(variable):
        return "the environment"
    path = settings_home() / ENV_FILE_NAME
    if read_env_file(path).get(variable):
        return str(path)
    return "nowhere (unset)"


def not_configured(variable: str) -> str:
    """What to do when ``variable`` is unset, in the words of an error."""
    looked_in = settings_home() / ENV_FILE_NAME
    return (
        f"{variable} is not set and no stack is running (looked in {looked_in}):"
        f" start one with `keel up`, or set KEEL_HOME to a running stack's home, or {variable}"
    )


class NotConfigured(KeelError, RuntimeError):
    """A server or secret this process needs is configured nowhere (``not_configured``)."""

    code = "not_configured"


def write_env_file(path: Path, values: dict[str, str]) -> None:
    """Replace ``path`` atomically; it holds secrets, so it is 0600 from its first byte
    (created with that mode, whatever the umask; never widened, then narrowed)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    lines = [f"{key}={shlex.quote(str(value))}" for key, value in sorted(values.items())]
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write("\n".join(lines) + "\n")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def sqlalchemy_url(url: str) -> str:
    """Use psycopg 3 whatever driver the URL names (``postgresql://`` included)."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def is_amqp(url: str) -> bool:
    """An AMQP broker URL (RabbitMQ), as kombu reads its scheme."""
    scheme = url.partition("://")[0].lower()
    return scheme in {"amqp", "amqps", "pyamqp"}


class _EnvFile(PydanticBaseSettingsSource):
    """``$KEEL_HOME/env`` (what ``keel up`` wrote), below the process environment."""

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        self.values = read_env_file(settings_home() / ENV_FILE_NAME)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.values.get(f"{PREFIX}{field_name.upper()}"), field_name, False

    def __call__(self) -> dict[str, Any]:
        found = {}
        for name, field in self.settings_cls.model_fields.items():
            value, _, _ = self.get_field_value(field, name)
            if value not in (None, ""):
                found[name] = value
        return found


class _DjangoSettings(PydanticBaseSettingsSource):
    """A Django project's settings (``DJANGO_SETTINGS_MODULE`` set): ``KEEL_*`` names in its
    settings module, the variables' own names, below the process environment. Keel's
    database is the project's default one when that is PostgreSQL and no ``KEEL_DATABASE_URL``
    names another (``keel.django``)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if not os.environ.get("DJANGO_SETTINGS_MODULE"):
            return {}
        try:
            from django.conf import settings as django_settings
        except ImportError:
            return {}
        found = {
            name: getattr(django_settings, f"{PREFIX}{name.upper()}")
            for name in self.settings_cls.model_fields
            if hasattr(django_settings, f"{PREFIX}{name.upper()}")
        }
        if "database_url" not in found:
            databases = getattr(django_settings, "DATABASES", {}) or {}
            url = django_database_url(databases.get("default") or {})
            if url:
                found["database_url"] = url
        return found


def django_database_url(database: dict[str, Any]) -> str | None:
    """A Django ``DATABASES`` entry as a URL, if it is PostgreSQL; else None.

    A ``HOST`` that starts with "/" is a Unix socket's folder: it goes in the query
    (``?host=``), where libpq takes it, since a URL's host part cannot hold a path. An
    empty ``HOST`` is libpq's default, as Django's own connection has it: no host.
    """
    if not str(database.get("ENGINE", "")).endswith("postgresql"):
        return None
    from urllib.parse import quote, urlencode

    user = quote(str(database.get("USER") or ""), safe="")
    password = quote(str(database.get("PASSWORD") or ""), safe="")
    credentials = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = str(database.get("HOST") or "")
    port = str(database.get("PORT") or "")
    name = quote(str(database.get("NAME") or ""), safe="")
    if host.startswith("/"):
        query = urlencode({"host": host, **({"port": port} if port else {})})
        return f"postgresql://{credentials}/{name}?{query}"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"  # an IPv6 address
    port_part = f":{port}" if port else ""
    return f"postgresql://{credentials}{host}{port_part}/{name}"


def _builtin_jobs_default() -> str:
    # Unlike other variables, KEEL_BUILTIN_JOBS="" is a choice (no built-in apps), and
    # the environment source drops empty values: read here before it does.
    return "none" if os.environ.get(f"{PREFIX}BUILTIN_JOBS") == "" else "reports,notifications"


class Settings(BaseSettings):
    """Every ``KEEL_*`` variable, with its type and default: the configuration of one process.

    Read from the process environment, then ``$KEEL_HOME/env``; an empty value
    means "unset". A value of the wrong type stops the process at start, naming it.
    """

    use_env_file: ClassVar[bool] = True  # below the environment: $KEEL_HOME/env
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_ignore_empty=True, frozen=True, extra="ignore"
    )

    # Servers and secrets (unset URLs: `keel up` starts embedded servers and writes them).
    database_url: str | None = None
    # The Postgres schema of Keel's tables, functions and triggers (a plain lowercase SQL
    # name), so another app's tables of the same names may share the database.
    database_schema: str = "public"
    # What stands between Keel and Postgres: `none` (nothing, or a pooler in session mode), or
    # `transaction`, a pooler that hands each transaction a server connection of its own
    # choosing (PgBouncer's `pool_mode = transaction`). There Keel sends no startup options
    # and prepares no statements: each transaction begins by setting Keel's timeouts and
    # search path for itself, one statement more per transaction. [Connection
    # poolers](../operations/index.md#connection-poolers).
    database_pooler: Literal["none", "transaction"] = "none"
    # Postgres itself, past the pooler: each worker's listener for jobs committed in a
    # caller's transaction connects here (LISTEN needs a session of its own). Unset: it uses
    # KEEL_DATABASE_URL, or, with `KEEL_DATABASE_POOLER=transaction`, does not listen (those
    # jobs are published within 5 s anyway).
    database_direct_url: str | None = None
    # Keel's Redis: redis://, rediss:// (TLS: ?ssl_ca_certs=PATH, and ssl_certfile, ssl_keyfile
    # for a client certificate) or sentinel://HOST:26379;sentinel://HOST2:26379/0?master_name=NAME
    # (Redis Sentinel). Celery's messages and results go there too, unless KEEL_BROKER_URL.
    # [Redis Sentinel](../operations/index.md#redis-sentinel), [TLS](../operations/index.md#tls).
    redis_url: str | None = None
    # Celery's messages only (``amqp://`` for RabbitMQ); unset: they go through Redis too.
    broker_url: str | None = None
    secret_key: str | None = None
    provider_url: str | None = None
    sandbox_admin_key: str = ""  # the provider sandbox's /admin and /v1/ledger
    home: Path = Field(default_factory=settings_home)
    # Ports of `keel up`'s web app, Flower and provider sandbox; gunicorn's process count.
    web_port: int = 8000
    flower_port: int = 5555
    sandbox_port: int = 8025
    web_workers: int = 2
    web_url: str | None = None  # written by `keel up` for scripts: where its API answers
    # Written by `keel up`, new at each start: /readyz names it, so that its probe knows
    # its own API from another server on the same port.
    stack_id: str = ""
    # Where people reach the web app (behind a proxy: its https:// URL); unset: KEEL_WEB_URL.
    # Redirects and links are built from it, never from a request's Host header (web.hosts).
    public_url: str | None = None
    # Host names the web app answers (comma-separated; ".example.com" = it and its
    # subdomains); unset: any. Probes (/healthz, /readyz) answer whatever the Host.
    trusted_hosts: str = ""
    flower_url: str | None = None  # the dashboard's Flower link; unset: the public host's port
    flower_user: str = "keel"
    flower_password: str | None = None  # unset: `keel up` derives one from the secret
    # Who reads the system-wide views (/metrics, /api/v1/system/status): a bearer token of its
    # own (a scraper's), never a tenant's; /metrics anyone if public (a private network only).
    # Unset: `keel up` generates the token.
    metrics_token: str | None = None
    metrics_public: bool = False
    # How Prometheus scrapes the web servers: "one" target, or "each" on its own, where one
    # server at a time serves the system-wide series (web.metrics_lease).
    metrics_scrape: Literal["one", "each"] = "one"
    # An API request's database work, pool wait included, before it is answered 503.
    request_deadline_s: float = Field(default=1.0, gt=0, le=60)
    # Logs of every process (tasks.platform.logs): JSON lines, or text lines on a terminal ("auto").
    log_format: Literal["auto", "json", "text"] = "auto"
    # DEBUG, INFO, WARNING, ERROR; unset: INFO (a worker's `-l`).
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None
    # Jobs: workers, locks, promotion, stalls, broker visibility.
    worker_concurrency: int = 3
    lock_duration_s: float = 30
    promote_interval_s: float = 0.1
    stalled_interval_s: float = 5
    max_stalled_count: int = 1
    # An aborted run (DELETE of an active job) still going this long after the request is
    # stopped by its worker (tasks.jobs.run.termination); it may stop by itself before.
    abort_grace_s: float = Field(default=10.0, ge=0, le=3600)
    # The longest `timeout` option a job may ask for (tasks.jobs.model.options): at most a day,
    # JobOptions' own bound. Keep it within a worker's shutdown grace, less Keel's margin.
    max_job_timeout_s: int = Field(default=86_400, ge=1, le=86_400)
    visibility_timeout_s: int = 60
    # A container health check passes through a Redis outage this long
    # (tasks.jobs.upkeep.healthcheck).
    health_redis_grace_s: float = Field(default=60.0, gt=0)
    # A prefetch slot held this long by a message no task of the worker has is given back
    # (tasks.jobs.run.slots); 0: never. At most 45 s: the health check reports a consumer that
    # consumed nothing for 60 s (tasks.jobs.upkeep.healthcheck), and not one that this repairs.
    prefetch_orphan_s: float = Field(default=30.0, ge=0, le=45)
    # How long a worker's task event waits for others to leave with it
    # (tasks.platform.celery_events).
    event_flush_s: float = Field(default=0.05, ge=0, le=60)
    # Waiting jobs whose message left the broker (a purge) are republished
    # (tasks.jobs.upkeep.reconcile).
    reconcile_interval_s: float = 15
    reconcile_grace_s: float = 10
    # Finished records whose job sets no removeOnComplete / removeOnFail of its own are
    # deleted once this old, failed ones into the failure archive (tasks.jobs.upkeep.retention);
    # 0: kept for ever. Unset, completed records follow Celery's result_expires (1 day).
    keep_completed_s: int | None = Field(default=None, ge=0)
    keep_failed_s: int = Field(default=7 * 86_400, ge=0)
    retention_interval_s: float = Field(default=60.0, gt=0)
    # The newest lines of a job's log (job.log(), self.log()) that are kept (tasks.jobs.store.logs).
    job_log_lines: int = Field(default=1_000, ge=1, le=10_000)
    # Per-queue concurrency and rate limits (JSON; tasks.platform.setting_types,
    # tasks.jobs.run.limits).
    queue_limits: Annotated[dict[str, QueueLimit], NoDecode] = Field(default_factory=dict)
    # Your own Celery app, set up with keel.install(app) ("proj.celery:app"), for the Keel
    # processes Celery does not start (the API, the CLI); empty: Keel's own app.
    celery_app: str = ""
    # Your own job modules (comma-separated import paths), loaded by every Keel process.
    job_modules: str = ""
    # Folders those modules import from (os.pathsep-separated), appended to every Keel
    # process's import path; `keel up` sets it to the folder it was started in.
    job_path: str = ""
    # Keel's own job apps that run (tasks.platform.catalog): "reports,notifications"; "" or "none":
    # neither.
    # An empty variable means none here (not "unset"); `keel up` writes it as "none".
    builtin_jobs: str = Field(default_factory=_builtin_jobs_default)
    # Tenants: quotas (JSON; tasks.platform.quotas), token lifetime, request rates ("600/minute").
    tenant_quotas: Annotated[TenantQuotas, NoDecode] = Field(default_factory=TenantQuotas)
    token_max_ttl_s: int = 30 * 86_400
    # How long a creating request's Idempotency-Key replays its first answer (web.idempotency).
    idempotency_ttl_s: int = Field(default=86_400, ge=60, le=30 * 86_400)
    # Webhooks (tasks.jobs.model.webhooks): networks a delivery may reach although they are not
    # public (comma-separated CIDRs, e.g. "10.0.0.0/8"; none by default), and how a delivery
    # is retried (attempts; the first backoff wait, doubled at each attempt, with jitter).
    webhook_allow: str = ""
    webhook_attempts: int = Field(default=12, ge=1, le=50)
    webhook_backoff_ms: int = Field(default=2_000, ge=10, le=3_600_000)
    webhook_timeout_s: float = Field(default=10.0, gt=0, le=60)
    ui_session_s: int = 8 * 3600  # how long a dashboard sign-in (`keel ui-link`) lasts
    # Earlier secret keys, still accepted while tokens and sessions signed with them live
    # (comma-separated): a rotation signs nobody out.
    secret_key_fallbacks: str = ""
    # Sign-in with the team's identity provider (web.oidc): its issuer URL (discovery), the
    # dashboard's client, the audience API tokens carry, and the claims that name the
    # tenant, the user and the roles (dotted paths: realm_access.roles).
    oidc_issuer: str | None = None
    oidc_client_id: str | None = None
    oidc_client_secret: str | None = None
    oidc_audience: str | None = None
    oidc_tenant_claim: str = "tenant"
    oidc_tenant: str | None = None
    oidc_user_claim: str = "sub"
    oidc_roles_claim: str = "roles"
    # A dashboard session nobody used (no page opened, no form sent) for this long ends.
    ui_idle_s: int = Field(default=3600, gt=0)
    # Secure on the session cookie always (else on HTTPS requests only, X-Forwarded-Proto too).
    ui_secure_cookie: bool = False
    # Open event streams per user and per tenant (web.stream_leases): a number, or "off".
    streams_per_user: str = "16"
    streams_per_tenant: str = "64"
    tenant_rate_limit: str = "6000/minute"
    user_rate_limit: str | None = None  # None: half the tenant's
    # Reports and campaigns.
    fault_injection: bool = False  # accept failUntilAttempt and crash switches
    report_step_pause_ms: int = 400
    campaign_quiet_s: float = 120
    provider_capacity: int = 10_000
    provider_retry_attempts: int = 8
    provider_retry_delay_ms: int = 500

    @field_validator("database_pooler", mode="before")
    @classmethod
    def _pooler(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_format", "log_level", mode="before")
    @classmethod
    def _log_word(cls, value: Any, info: ValidationInfo) -> Any:
        """``KEEL_LOG_LEVEL=info`` and ``KEEL_LOG_FORMAT=JSON`` are meant too; empty: unset."""
        if not isinstance(value, str):
            return value
        value = value.strip()
        if not value:
            return None if info.field_name == "log_level" else "auto"
        return value.upper() if info.field_name == "log_level" else value.lower()

    @field_validator("database_schema")
    @classmethod
    def _schema(cls, name: str) -> str:
        # Written into SQL and libpq options as is: a plain identifier, nothing to quote.
        name = name.strip()
        if not SCHEMA_NAME.fullmatch(name):
            raise ValueError(
                "must be a plain SQL name: lowercase letters, digits and _, "
                "not starting with a digit, at most 63 characters"
            )
        return name

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, url: str | None) -> str | None:
        if url is not None:
            parse(url)  # a ValueError names what is wrong; the setting keeps the URL as written
        return url

    @field_validator("broker_url")
    @classmethod
    def _rabbitmq(cls, url: str | None) -> str | None:
        # Not a second Redis: the broker epoch and the reconciler read Celery's queues
        # through Keel's own Redis (tasks.jobs.upkeep.broker_reset, tasks.jobs.upkeep.reconcile).
        if url is not None and not is_amqp(url):
            raise ValueError("must be an amqp:// URL (RabbitMQ); unset, messages go through Redis")
        return url

    @field_validator("webhook_allow")
    @classmethod
    def _webhook_allow(cls, value: str) -> str:
        parse_networks(value)  # a malformed network stops the process at start, loudly
        return value

    @field_validator("queue_limits", mode="before")
    @classmethod
    def _queue_limits(cls, value: Any) -> Any:
        # The variable is JSON text; an empty one means no limits. Parsed here, so a
        # malformed value stops every process at start, naming KEEL_QUEUE_LIMITS.
        return parse_queue_limits(value) if isinstance(value, str) else value

    @field_validator("tenant_quotas", mode="before")
    @classmethod
    def _tenant_quotas(cls, value: Any) -> Any:
        return parse_tenant_quotas(value) if isinstance(value, str) else value

    @field_validator("builtin_jobs")
    @classmethod
    def _builtin(cls, text: str) -> str:
        from tasks.platform.builtins import parse_builtin

        return ",".join(parse_builtin(text)) or "none"

    @field_validator("streams_per_user", "streams_per_tenant")
    @classmethod
    def _stream_cap(cls, text: str) -> str:
        text = text.strip().lower()
        if text in ("off", "none", "0"):
            return "off"
        if not (text.isascii() and text.isdigit()):
            raise ValueError("must be a number of streams, or off")
        return text

    @field_validator("home")
    @classmethod
    def _absolute(cls, home: Path) -> Path:
        return home.resolve()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        django = _DjangoSettings(settings_cls)
        if not cls.use_env_file:
            return init_settings, env_settings, django
        return init_settings, env_settings, django, _EnvFile(settings_cls)

    @property
    def secret_fallbacks(self) -> list[str]:
        """``KEEL_SECRET_KEY_FALLBACKS`` as a list (empty entries left out)."""
        return [key.strip() for key in self.secret_key_fallbacks.split(",") if key.strip()]

    @property
    def sqlalchemy_url(self) -> str:
        if not self.database_url:
            raise NotConfigured(not_configured("KEEL_DATABASE_URL"))
        return sqlalchemy_url(self.database_url)

    @property
    def redis(self) -> str:
        """Keel's Redis (events, limits, metrics, heartbeats, results); required."""
        if not self.redis_url:
            raise NotConfigured(not_configured("KEEL_REDIS_URL"))
        return self.redis_url

    @property
    def redis_target(self) -> RedisTarget:
        """``KEEL_REDIS_URL`` parsed: Sentinel, TLS, and what each library is given."""
        return parse(self.redis)

    @property
    def celery_broker_url(self) -> str:
        """Where Celery's messages go: ``KEEL_BROKER_URL``, else Keel's Redis."""
        return self.broker_url or self.redis

    @cached_property  # read for every message published
    def broker_on_amqp(self) -> bool:
        """Whether the broker is RabbitMQ (an ``amqp``/``pyamqp`` URL) rather than Redis."""
        return is_amqp(self.broker_url or "")


class ProcessSettings(Settings):
    """The process environment alone, without ``$KEEL_HOME/env``.

    For ``keel up``: it decides what that file will say, so an earlier run's
    URLs in it must not count as configured servers.
    """

    use_env_file: ClassVar[bool] = False
    home: Path = Field(default_factory=keel_home)  # keel up's own: ./.keel, found or not


_current: Settings | None = None
_generation = 0  # counts reloads and forgets: a read begun before one is not kept
_loading = threading.Lock()  # held only to swap, never while reading (which may re-enter)


def get_settings() -> Settings:
    """Settings of this process; read once, call ``reload_settings`` after changing env.

    Reading them may come back here (a settings source that imports a project which reads
    them: Django's settings importing the project's Celery app), so nothing is held while
    they are read.
    """
    global _current
    while True:
        settings, generation = _current, _generation
        if settings is not None:
            return settings
        fresh = Settings()
        with _loading:
            if generation == _generation:  # else reloaded or forgotten meanwhile: again
                if _current is None:
                    _current = fresh
                return _current


def reload_settings() -> Settings:
    """Read the settings again and put them in place in one step: a thread that reads them
    meanwhile gets the old ones or the new, and cannot leave the old ones behind (as a cache
    that is cleared, then filled by whichever thread finishes last, can)."""
    global _current, _generation
    fresh = Settings()
    with _loading:
        _current, _generation = fresh, _generation + 1
    return fresh


def forget_settings() -> None:
    """Read the settings again when next asked (after a change of env or of ``KEEL_HOME``)."""
    global _current, _generation
    with _loading:
        _current, _generation = None, _generation + 1
