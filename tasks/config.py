"""Keel's settings, read from the environment and from ``$KEEL_HOME/env``.

``keel up`` writes the effective values of a running stack to
``$KEEL_HOME/env`` so that every other ``keel`` command, worker or script
finds the same servers without being told. Variables set in the process
environment always win over that file.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ENV_FILE_NAME = "env"


def keel_home() -> Path:
    """The folder holding embedded state (``KEEL_HOME``, default ``./.keel``)."""
    return Path(os.environ.get("KEEL_HOME", ".keel")).resolve()


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


def write_env_file(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{key}={shlex.quote(str(value))}" for key, value in sorted(values.items())]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


def _lookup(name: str, file_values: dict[str, str], default: str | None = None) -> str | None:
    if name in os.environ:
        return os.environ[name]
    return file_values.get(name, default)


def sqlalchemy_url(url: str) -> str:
    """Use psycopg 3 whatever driver the URL names (``postgresql://`` included)."""
    for prefix in ("postgresql+psycopg2://", "postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


@dataclass(frozen=True)
class Settings:
    """Effective configuration of one Keel process."""

    database_url: str | None
    redis_url: str | None
    secret_key: str | None
    fault_injection: bool
    provider_url: str | None
    home: Path
    web_port: int
    flower_port: int
    sandbox_port: int
    report_step_pause_ms: int
    worker_concurrency: int
    lock_duration_s: float
    promote_interval_s: float
    stalled_interval_s: float
    visibility_timeout_s: int
    campaign_quiet_s: float
    provider_capacity: int
    provider_retry_attempts: int
    provider_retry_delay_ms: int
    max_stalled_count: int
    queue_limits: str = ""  # KEEL_QUEUE_LIMITS, JSON; parsed by tasks.jobs.limits
    tenant_quotas: str = ""  # KEEL_TENANT_QUOTAS, JSON; parsed by tasks.quotas
    token_max_ttl_s: int = 30 * 86_400  # KEEL_TOKEN_MAX_TTL_S
    sandbox_admin_key: str = ""  # KEEL_SANDBOX_ADMIN_KEY: the sandbox's /admin and /v1/ledger

    @property
    def sqlalchemy_url(self) -> str:
        if not self.database_url:
            raise RuntimeError(
                "KEEL_DATABASE_URL is not set and no stack is running: start one with `keel up`"
            )
        return sqlalchemy_url(self.database_url)

    @property
    def broker_url(self) -> str:
        if not self.redis_url:
            raise RuntimeError(
                "KEEL_REDIS_URL is not set and no stack is running: start one with `keel up`"
            )
        return self.redis_url


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """Settings of this process; cached, call ``reload_settings`` after changing env."""
    home = keel_home()
    file_values = read_env_file(home / ENV_FILE_NAME)

    def get(name: str, default: str | None = None) -> str | None:
        return _lookup(name, file_values, default)

    return Settings(
        database_url=get("KEEL_DATABASE_URL"),
        redis_url=get("KEEL_REDIS_URL"),
        secret_key=get("KEEL_SECRET_KEY"),
        fault_injection=get("KEEL_FAULT_INJECTION", "0") == "1",
        provider_url=get("KEEL_PROVIDER_URL"),
        home=home,
        web_port=int(get("KEEL_WEB_PORT", "8000") or 8000),
        flower_port=int(get("KEEL_FLOWER_PORT", "5555") or 5555),
        sandbox_port=int(get("KEEL_SANDBOX_PORT", "8025") or 8025),
        report_step_pause_ms=int(get("KEEL_REPORT_STEP_PAUSE_MS", "400") or 400),
        worker_concurrency=int(get("KEEL_WORKER_CONCURRENCY", "3") or 3),
        lock_duration_s=float(get("KEEL_LOCK_DURATION_S", "30") or 30),
        promote_interval_s=float(get("KEEL_PROMOTE_INTERVAL_S", "0.1") or 0.1),
        stalled_interval_s=float(get("KEEL_STALLED_INTERVAL_S", "5") or 5),
        visibility_timeout_s=int(get("KEEL_VISIBILITY_TIMEOUT_S", "60") or 60),
        campaign_quiet_s=float(get("KEEL_CAMPAIGN_QUIET_S", "120") or 120),
        provider_capacity=int(get("KEEL_PROVIDER_CAPACITY", "10000") or 10000),
        provider_retry_attempts=int(get("KEEL_PROVIDER_RETRY_ATTEMPTS", "8") or 8),
        provider_retry_delay_ms=int(get("KEEL_PROVIDER_RETRY_DELAY_MS", "500") or 500),
        max_stalled_count=int(get("KEEL_MAX_STALLED_COUNT", "1") or 1),
        queue_limits=get("KEEL_QUEUE_LIMITS", "") or "",
        tenant_quotas=get("KEEL_TENANT_QUOTAS", "") or "",
        token_max_ttl_s=int(get("KEEL_TOKEN_MAX_TTL_S", str(30 * 86_400)) or 30 * 86_400),
        sandbox_admin_key=get("KEEL_SANDBOX_ADMIN_KEY", "") or "",
    )


def reload_settings() -> Settings:
    get_settings.cache_clear()
    return get_settings()
