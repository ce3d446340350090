"""What the configuration reference says about a setting, beyond its comment in the code.

Keyed by ``Settings`` field name. The page takes a field's note when it has
one, else its ``description`` or the comment written at it in
``tasks/platform/config.py``; a field with none of these stops the generator, and so
does a note for a field that no longer exists.

``OTHER_VARIABLES`` are read outside ``Settings``: by the provider sandbox
(which imports nothing of Keel), by ``compose.yaml`` and by the image build.
"""

from __future__ import annotations

NOTES: dict[str, str] = {
    "database_url": (
        "Postgres, as `postgresql://USER:PASSWORD@HOST:5432/DB` (read with psycopg 3 whatever"
        " driver the URL names). Unset: `keel up` starts an embedded Postgres under"
        " `$KEEL_HOME` and writes its URL to `$KEEL_HOME/env`; any other command then reads it"
        " there."
    ),
    "database_schema": (
        "The Postgres schema of Keel's tables, functions and triggers: a plain lowercase SQL"
        " name, created by `keel db upgrade` if missing. Set it (`keel`, say) to share a"
        " database with another app whose tables have the same names; every Keel process"
        " must have the same value. Changing it moves nothing: [Keel's tables in a schema of"
        " their own](../operations/index.md#keels-tables-in-a-schema-of-their-own)."
    ),
    "redis_url": (
        "Keel's Redis, required by every process: events, queue limits, metrics, heartbeats,"
        " dead letters, request rate limits, Celery's result backend for chords, and Celery's"
        " messages unless `KEEL_BROKER_URL` is set. Unset: `keel up` starts an embedded Redis"
        " (with a password in this URL, and no `CONFIG` command) and writes its URL."
        " `rediss://USER:PASSWORD@HOST/0?ssl_ca_certs=PATH` for TLS (and `ssl_certfile`,"
        " `ssl_keyfile` for a client certificate; [TLS](../operations/index.md#tls)),"
        " `sentinel://HOST:26379;sentinel://HOST2:26379/0?master_name=NAME` for Redis"
        " Sentinel ([Redis Sentinel](../operations/index.md#redis-sentinel))."
    ),
    "broker_url": (
        "`amqp://USER:PASSWORD@HOST:5672/VHOST`: Celery's messages go through RabbitMQ"
        " ([RabbitMQ as the broker](../operations/rabbitmq.md)); unset: through"
        " `KEEL_REDIS_URL`. Any other scheme stops the process at start."
    ),
    "secret_key": (
        "The HS256 key that signs bearer tokens and dashboard sessions; at least 32 bytes."
        " Unset: `keel up` generates one once in `$KEEL_HOME/secret`. Web hosts and wherever"
        " `keel token` runs need the same key; a new key ends every dashboard session and"
        " token signed with the old one, unless the old one moves to"
        " `KEEL_SECRET_KEY_FALLBACKS`."
    ),
    "metrics_token": (
        "The bearer token of the system-wide views, `GET /metrics` (Prometheus: `authorization:"
        " credentials_file`) and `GET /api/v1/system/status` (monitoring): every tenant's"
        " figures, so no tenant's token reads them, an operator's included (403). Unset: they"
        " do not answer over HTTP (`keel status` still does), except `/metrics` with"
        " `KEEL_METRICS_PUBLIC`. `keel up` generates one once in `$KEEL_HOME/metrics-token` and"
        " writes it to `$KEEL_HOME/env`. Compared in constant time; never logged."
    ),
    "metrics_public": (
        "`1`: `GET /metrics` answers without a token — only where the API's port is reachable"
        " from a private network alone. Off by default: the API's port is the public one."
        " `GET /api/v1/system/status` still wants the metrics token."
    ),
    "metrics_scrape": (
        "How Prometheus reaches the web servers. `one`: one target (a single server, or a load"
        " balancer in front of several): every process serves every series. `each`: each"
        " server is a target of its own (Kubernetes pods, several hosts): one server at a time"
        " serves the system-wide series, elected in Redis for 60 s and renewed by its scrapes,"
        " and every server serves `keel_metrics_system_wide` (1 on the one that serves them),"
        " so a `sum` over targets counts each job once"
        " ([Several replicas](../operations/observe.md#several-replicas))."
    ),
    "provider_url": (
        "Where workers reach the messaging provider's group API; the provider sandbox is"
        " `http://HOST:8025` (`keel up` points it at its own sandbox)."
    ),
    "sandbox_admin_key": (
        "The provider sandbox's `/admin` and `/v1/ledger` need it in `X-Sandbox-Admin-Key`;"
        " unset: those routes answer 401. `keel up` generates one; the sandbox and"
        " `keel campaign verify` need the same."
    ),
    "home": (
        "Where embedded state lives: the embedded Postgres and Redis, the generated secret,"
        " and the `env` file `keel up` writes (shell `KEY=VALUE` lines: the effective values,"
        " which every `keel` command and worker reads when the variables are not set). Stays"
        " per host. Everything under it is created 0600/0700."
    ),
    "web_port": "The port of `keel up`'s web app (and compose's published web port).",
    "flower_port": "The port of `keel up`'s Flower (and compose's published Flower port).",
    "sandbox_port": "The port of `keel up`'s provider sandbox (and compose's, `demo` profile).",
    "web_workers": "gunicorn processes of the web app (`web/gunicorn_conf.py`).",
    "web_url": (
        "Written by `keel up` to `$KEEL_HOME/env`: where its API answers, for scripts and"
        " `keel ui-link`. `KEEL_PUBLIC_URL` falls back to it."
    ),
    "public_url": (
        "Where people reach the web app, e.g. behind a TLS proxy `https://keel.example.com`;"
        " unset: `KEEL_WEB_URL`. Redirects and links are built from it, never from a request's"
        " `Host` header; with neither set a redirect is a path alone."
    ),
    "trusted_hosts": (
        "Comma-separated host names the web app answers, `.example.com` for a domain and its"
        " subdomains; unset: any. Another host is answered 400 `untrusted_host`, except"
        " `/healthz` and `/readyz`, which an orchestrator sends to a pod's address."
    ),
    "flower_url": (
        "The dashboard's link to Flower, shown to operators only; unset: the public URL's host"
        " at `KEEL_FLOWER_PORT`, and no link when neither is known."
    ),
    "flower_user": "Flower's basic-auth user.",
    "flower_password": (
        "Flower's basic-auth password (its pages, API, `/metrics` and `/healthcheck`); unset:"
        " `keel up` derives one from the secret and writes it to `$KEEL_HOME/env`. compose"
        " requires it. Flower gets it in its environment, never on its command line. Flower"
        " is system-wide: whoever has it sees and controls every tenant's tasks"
        " ([Dashboard](../dashboard.md#flower))."
    ),
    "request_deadline_s": (
        "An API request's database time, pool wait included, before it is answered 503 with"
        " `Retry-After` ([Serving and timeouts](../serving.md))."
    ),
    "worker_concurrency": "Jobs a worker runs at once (Celery's `worker_concurrency`).",
    "lock_duration_s": (
        "How long a running job's lock lasts without renewal; a job whose lock ran out (its"
        " worker died or was cut off, or Postgres was away longer than this, so no worker"
        " could renew) is stalled and taken over, and counts in `stalledCount`. Give every"
        " worker the same."
    ),
    "promote_interval_s": (
        "How often a worker's maintenance loop publishes due delayed jobs and parked jobs."
    ),
    "stalled_interval_s": (
        "How often workers look for stalled jobs (lost locks), and for chord parts that name"
        " an existing job."
    ),
    "max_stalled_count": "Stalls after which a job fails instead of being requeued.",
    "max_job_timeout_s": (
        "The longest `timeout` option a job may ask for, in seconds (at most a day, the"
        " default): `POST /api/v1/jobs` and a scheduler's template answer 400 naming"
        " `opts.timeout` past it, and `JobOptions(timeout=...)` (`keel.add`, a task's"
        " `default_job_options`) raises a validation error. Jobs recorded before it was"
        " lowered keep their timeout. A run that outlasts a worker's shutdown grace is killed"
        " by a rollout and runs again as stalled, so set it, and the grace, together: at most"
        " the grace less 30 s ([The worker's grace"
        " period](../operations/kubernetes.md#the-workers-grace-period)). A Celery call's"
        " `time_limit=` and `soft_time_limit=` past it are refused by the call (`ValueError`)."
    ),
    "visibility_timeout_s": (
        "Redis broker: a message a worker took but did not acknowledge (the worker died or was"
        " cut off) comes back after this long; the claim refuses the copy of a job still"
        " running. Give every worker the same. Not used with RabbitMQ."
    ),
    "health_redis_grace_s": (
        "How long a worker's (or beat's) container health check"
        " (`python -m tasks.jobs.upkeep.healthcheck`) passes while Redis does not answer."
    ),
    "event_flush_s": (
        "How long a Celery task event waits for others of its process to go out with it as"
        " one `task.multi` message: a worker's (or until Celery's buffer of 24 fills), and the"
        " `task-sent` of a job added on its own (a Redis broker's; on RabbitMQ it goes with"
        " its message). 0: each goes at once (a job's `task-sent` with its message)."
    ),
    "reconcile_interval_s": (
        "How often one worker compares waiting jobs with the broker's queues and republishes"
        " those whose message is gone (a purge; Redis broker only)."
    ),
    "reconcile_grace_s": (
        "A waiting job is compared with the broker only once it was last published this long ago."
    ),
    "log_format": (
        "`json`: one JSON object per line; `text`: Celery's line with Keel's fields after it;"
        " `auto`: text on a terminal, JSON anywhere else. See"
        " [Observe](../operations/observe.md)."
    ),
    "log_level": "The level of every Keel process's logs; unset: INFO (a worker's `-l`).",
    "keep_completed_s": (
        "A completed record whose job sets no `removeOnComplete` is deleted once it ended this"
        " many seconds ago; 0 keeps it. Unset: Celery's `result_expires` (1 day by default)."
    ),
    "keep_failed_s": (
        "A failed or cancelled record whose job sets no `removeOnFail` is deleted (a failed one"
        " into the failure archive) once it ended this many seconds ago (7 days); 0 keeps it."
    ),
    "retention_interval_s": (
        "How often one worker deletes the finished records past those ages, in batches."
    ),
    "job_log_lines": (
        "How many lines of a job's log (`job.log()`, `self.log()`) are kept: the newest; an"
        " older line is deleted as a new one is written. Each line is at most 2,000 characters;"
        " at most 10,000 lines, so that deleting a finished job (retention) stays cheap."
    ),
    "queue_limits": (
        'JSON per queue, e.g. `{"reports": {"concurrency": 4, "rate": {"max": 10,'
        ' "duration_ms": 1000}}}`: at most that many running at once and that many started'
        " per duration, across every worker. Give every worker the same. It is each queue's"
        " default: `keel queues limits set` or the system API change a queue's limits live"
        " ([Changing queue limits live](../operations/observe.md#changing-queue-limits-live))."
    ),
    "job_modules": (
        "Your own job modules, comma-separated import paths, loaded by every Keel process"
        " (worker, beat, web and CLI); `keel up --include` adds to it."
    ),
    "job_path": (
        "Folders your job modules import from, separated by `:`; each Keel process appends"
        " them to its import path (after Keel's own packages). `keel up` sets it to the folder"
        " it was started in, so `keel up --include mytasks` finds `./mytasks.py` in the"
        " worker, beat, web and Flower it starts, as `python -m` would; `PYTHONPATH` reaches"
        " them too."
    ),
    "builtin_jobs": (
        "The seed's apps that run: `reports`, `notifications`, both (the default) or neither"
        " (empty or `none`). An app that is off has no job types, queues, standing"
        " schedulers, endpoints, pages or metrics; beat removes the schedulers an earlier run"
        " stored, and `keel up` starts no provider sandbox without `notifications`."
    ),
    "tenant_quotas": (
        'JSON, e.g. `{"liveJobs": 500}`; the quotas and their defaults are in'
        " [Tenants](../tenants.md#quotas)."
    ),
    "token_max_ttl_s": (
        "The longest a bearer token may live: `exp` at most this long after `iat` (30 days)."
    ),
    "ui_session_s": "A dashboard sign-in's whole life, however busy (8 h).",
    "idempotency_ttl_s": (
        "How long a creating request sent with an `Idempotency-Key` header answers the same"
        " key and body with its first answer (24 h); after it, the key is new again"
        " ([Idempotency keys](../jobs.md#idempotency-keys))."
    ),
    "webhook_allow": (
        "Networks a webhook delivery may reach although they are not public addresses,"
        " comma-separated (`10.0.0.0/8,fd00::/8`; none by default: this machine and private"
        " networks are refused) ([Webhooks](../jobs.md#webhooks))."
    ),
    "webhook_attempts": "Attempts of a webhook delivery before it fails for good (12).",
    "webhook_backoff_ms": (
        "A webhook delivery's first wait before it is tried again, doubled at each attempt,"
        " with jitter (2 s)."
    ),
    "webhook_timeout_s": "How long a webhook delivery waits for the endpoint's answer (10 s).",
    "secret_key_fallbacks": (
        "Earlier values of `KEEL_SECRET_KEY`, comma-separated: bearer tokens, dashboard"
        " sessions and sign-in links signed with one of them are still accepted (new ones are"
        " signed with `KEEL_SECRET_KEY`). Rotate by moving the old key here and setting a new"
        " one; drop it once `KEEL_TOKEN_MAX_TTL_S` has passed"
        " ([Identity](../operations/identity.md#rotating-the-secret-key))."
    ),
    "oidc_issuer": (
        "Your identity provider's issuer URL (Okta, Entra ID, Keycloak, Google, …); Keel"
        " reads its discovery document (`/.well-known/openid-configuration`) and keys"
        " (`jwks_uri`). Set: the API accepts its RS256 and ES256 access tokens, and the"
        " dashboard offers its sign-in ([Identity](../operations/identity.md))."
    ),
    "oidc_client_id": (
        "The dashboard's OpenID Connect client at the provider (authorization code with"
        " PKCE); the redirect URI to register is `KEEL_PUBLIC_URL` + `/ui/oidc/callback`."
    ),
    "oidc_client_secret": "The client's secret, for a confidential client; unset: a public one.",
    "oidc_audience": (
        "The `aud` the API requires of the provider's access tokens; unset: `KEEL_OIDC_CLIENT_ID`."
    ),
    "oidc_tenant_claim": ("The claim holding the tenant id (a dotted path for a nested one)."),
    "oidc_tenant": (
        "One tenant for everyone the provider signs in, for a provider that has no tenant"
        " claim; set, `KEEL_OIDC_TENANT_CLAIM` is not read."
    ),
    "oidc_user_claim": "The claim holding the user id (`sub`).",
    "oidc_roles_claim": (
        "The claim holding the roles: a list, or a space-separated string (`operator` is"
        " the one Keel knows); a dotted path for a nested one (`realm_access.roles`)."
    ),
    "ui_idle_s": (
        "A dashboard session nobody used (no page opened, no form sent) for this long ends;"
        " a page's own refreshes and live streams do not count."
    ),
    "ui_secure_cookie": (
        "Make the dashboard's session cookie `Secure` on plain HTTP too (a browser then keeps"
        " it only over HTTPS or on localhost); behind HTTPS it is `Secure` anyway."
    ),
    "streams_per_user": (
        "Open event streams (API and dashboard) a user may hold at once, across every API"
        " process and host; `off` turns the cap off."
    ),
    "streams_per_tenant": "The same for a tenant; `off` turns the cap off.",
    "tenant_rate_limit": "Requests per tenant (`N/second`, `N/minute`, `N/hour`).",
    "user_rate_limit": "Requests per user within its tenant; unset: half the tenant's.",
    "fault_injection": (
        "`1` accepts the report field `failUntilAttempt` (and the tests' crash switches);"
        " off in production."
    ),
    "report_step_pause_ms": "The pause between a report job's steps (load, render, upload).",
    "campaign_quiet_s": (
        "An unfinished campaign with no progress for this long is flagged `stalled` by the monitor."
    ),
    "provider_capacity": (
        "Messages per provider group (the provider drops what is over): a full group closes"
        " its generation; chunks are never larger."
    ),
    "provider_retry_attempts": "Attempts of a job that calls the provider.",
    "provider_retry_delay_ms": ("The base delay of those jobs' exponential backoff (jitter 0.5)."),
}

OTHER_VARIABLES: dict[str, str] = {
    "KEEL_SANDBOX_HOSTS": (
        "The provider sandbox: names it answers besides IP addresses, `localhost` and"
        " single-label names such as compose's `sandbox`. It refuses other `Host`s, any"
        " foreign `Origin` and non-JSON bodies, so no page in a browser can drive it."
    ),
    "KEEL_SANDBOX_HOME": "The provider sandbox's ledger folder; unset: `$KEEL_HOME/sandbox`.",
    "KEEL_SANDBOX_CAPACITY": (
        "The provider sandbox's group capacity (10000) until `PUT /admin/config` says otherwise."
    ),
    "OTEL_TRACES_EXPORTER": (
        "Traces ([Observe](../operations/observe.md#traces)): `otlp` (OTLP over HTTP),"
        " `console`, or both; unset or `none`: off. The other `OTEL_*` variables"
        " (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER`, ...) are"
        " OpenTelemetry's own; an empty one counts as unset."
    ),
    "KEEL_IMAGE": "compose: Keel's image (`keel:latest`).",
    "KEEL_POSTGRES_IMAGE": "compose: the Postgres image (`postgres:16`).",
    "KEEL_REDIS_IMAGE": "compose: the Redis image (`redis:7`).",
    "KEEL_RABBITMQ_IMAGE": (
        "compose: the RabbitMQ image of the `rabbitmq` profile (`rabbitmq:3-management`)."
    ),
    "KEEL_POSTGRES_PASSWORD": "compose: the database password (`keel`; Postgres is not published).",
    "KEEL_RABBITMQ_PASSWORD": "compose: the RabbitMQ user `keel`'s password (`keel`).",
    "KEEL_BASE_IMAGE": (
        "compose's build: the image's base (`BASE_IMAGE` of the `Dockerfile`, default"
        " `python:3.11-slim`)."
    ),
}
