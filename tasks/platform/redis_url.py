"""``KEEL_REDIS_URL``: one value for Keel's own Redis clients, Celery's broker and its results.

Three forms (docs/operations/index.md, "Redis Sentinel" and "TLS"):

- ``redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]``: one Redis, as always. Handed to every
  library as written.
- ``rediss://[[USER]:PASSWORD@]HOST[:PORT][/DB]?ssl_ca_certs=PATH``: one Redis over TLS.
  Query parameters ``ssl_ca_certs`` (the CA file that signed the server's certificate;
  unset: the system's CAs), ``ssl_certfile`` and ``ssl_keyfile`` (a client certificate,
  where the server asks for one: ``tls-auth-clients``), ``ssl_cert_reqs`` (``required``,
  the default; ``optional``; ``none``, which checks nothing). Keel takes them out of the
  URL and gives the same TLS options to redis-py, to kombu (``broker_use_ssl``: kombu
  alone would connect with no certificate check at all) and to Celery's result backend
  (``redis_backend_use_ssl``). The server's certificate must name the URL's host.
- ``sentinel://[[USER]:PASSWORD@]HOST[:PORT][;sentinel://HOST[:PORT]...][/DB]?master_name=NAME``:
  Redis Sentinel, kombu's form (``;`` between sentinels, port 26379 unless given) with the
  monitored primary's name as a query parameter (it may follow any of the sentinels).
  Credentials and the database are the Redis servers', not the sentinels' (which Keel
  reaches without a password); Keel writes them onto every sentinel's part for kombu and
  Celery, which read them from the first. Keel's clients ask the sentinels for the
  primary (``redis.sentinel.Sentinel(...).master_for``), and again when it is lost.

A malformed value stops every process at start, naming ``KEEL_REDIS_URL``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit, urlunsplit

if TYPE_CHECKING:  # redis-py is imported on first use: the settings need only the parsing
    import redis

SENTINEL_PORT = 26379
SSL_PARAMS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs")
CERT_REQS = {
    "required": ssl.CERT_REQUIRED,
    "cert_required": ssl.CERT_REQUIRED,
    "optional": ssl.CERT_OPTIONAL,
    "cert_optional": ssl.CERT_OPTIONAL,
    "none": ssl.CERT_NONE,
    "cert_none": ssl.CERT_NONE,
}


@dataclass(frozen=True)
class RedisTarget:
    """One ``KEEL_REDIS_URL``, parsed: what each library is given."""

    url: str  # as written
    scheme: str  # redis, rediss, unix, sentinel
    host: str  # the Redis host, or the first sentinel's: for messages
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None
    username: str | None = None
    password: str | None = None
    db: int = 0
    ssl: dict[str, Any] | None = None  # TLS options, as redis-py, kombu and Celery take them
    # The URL for kombu and Celery: without Keel's query parameters; a sentinel URL with
    # the credentials and database on every part.
    library_url: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def is_sentinel(self) -> bool:
        return bool(self.sentinels)

    def client(self, **options: Any) -> redis.Redis:
        """A redis-py client of Keel's, with ``options`` (timeouts, retry) for each connection.

        Through Sentinel: the primary the sentinels name, asked again whenever a
        connection to it is lost or it answers as a replica; the sentinels themselves are
        asked with the same connect and socket timeouts."""
        import redis
        from redis.sentinel import Sentinel

        if self.is_sentinel:
            asked = {k: v for k, v in options.items() if k.startswith("socket_")}
            manager = Sentinel(list(self.sentinels), sentinel_kwargs=asked)
            master: redis.Redis = manager.master_for(
                self.master_name or "",
                redis_class=redis.Redis,
                username=self.username,
                password=self.password,
                db=self.db,
                **options,
            )
            return master
        if self.ssl is not None:
            return redis.Redis.from_url(self.library_url, **self.ssl, **options)
        return redis.Redis.from_url(self.url, **options)

    def shown(self) -> str:
        """The URL without its password, for messages."""
        return hide_password(self.url)

    def shown_without_query(self) -> str:
        """The URL without its password and query (file paths), for one-line messages."""
        return hide_password(self.url).partition("?")[0]


def hide_password(url: str) -> str:
    parts = []
    for part in url.split(";"):
        split = urlsplit(part)
        if split.password is None:
            parts.append(part)
            continue
        host = split.netloc.rpartition("@")[2]
        parts.append(urlunsplit(split._replace(netloc=f"{split.username or ''}:***@{host}")))
    return ";".join(parts)


def _tls_options(query: dict[str, str]) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        if query.get(name):
            options[name] = query[name]
    reqs = query.get("ssl_cert_reqs")
    if reqs:
        if reqs.strip().lower() not in CERT_REQS:
            raise ValueError("ssl_cert_reqs must be required, optional or none")
        options["ssl_cert_reqs"] = CERT_REQS[reqs.strip().lower()]
    if ("ssl_certfile" in options) != ("ssl_keyfile" in options):
        raise ValueError("a client certificate needs both ssl_certfile and ssl_keyfile")
    return options


def _db(path: str) -> int:
    path = path.strip("/")
    if not path:
        return 0
    if not path.isdigit():
        raise ValueError(f"the database must be a number, not {path!r}")
    return int(path)


def _sentinel(url: str) -> RedisTarget:
    hosts: list[tuple[str, int]] = []
    query: dict[str, str] = {}
    users, passwords, dbs = set(), set(), set()
    for part in url.split(";"):
        split = urlsplit(part.strip())
        if split.scheme != "sentinel":
            raise ValueError(f"each part of a sentinel URL starts sentinel://, not {part!r}")
        if not split.hostname:
            raise ValueError(f"a sentinel without a host: {part!r}")
        hosts.append((split.hostname, split.port or SENTINEL_PORT))
        for name, value in parse_qsl(split.query, keep_blank_values=True):
            if name in query and query[name] != value:
                raise ValueError(f"{name} is given twice, differently")
            query[name] = value
        if split.username:
            users.add(unquote(split.username))
        if split.password is not None:
            passwords.add(unquote(split.password))
        if split.path.strip("/"):
            dbs.add(_db(split.path))
    for what, found in (("user", users), ("password", passwords), ("database", dbs)):
        if len(found) > 1:
            raise ValueError(f"the sentinels' parts name different {what}s")
    master = query.pop("master_name", "").strip()
    if not master:
        raise ValueError("a sentinel URL needs ?master_name=NAME (the primary sentinels monitor)")
    tls = [name for name in SSL_PARAMS if name in query]
    if tls:
        raise ValueError(f"TLS through Sentinel is not supported ({', '.join(tls)})")
    if query:
        raise ValueError(f"unknown parameter of a sentinel URL: {', '.join(sorted(query))}")
    username = next(iter(users), None)
    password = next(iter(passwords), None)
    db = next(iter(dbs), 0)
    auth = ""
    if password is not None:
        auth = f"{quote(username or '', safe='')}:{quote(password, safe='')}@"
    elif username:
        auth = f"{quote(username, safe='')}@"
    library = ";".join(f"sentinel://{auth}{_netloc(host, port)}/{db}" for host, port in hosts)
    return RedisTarget(
        url=url,
        scheme="sentinel",
        host=hosts[0][0],
        sentinels=tuple(hosts),
        master_name=master,
        username=username,
        password=password,
        db=db,
        library_url=library,
    )


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@lru_cache(maxsize=8)
def parse(url: str) -> RedisTarget:
    """``url`` (a ``KEEL_REDIS_URL``) parsed; ``ValueError`` saying what is wrong with it."""
    url = url.strip()
    scheme = url.partition("://")[0].lower()
    if scheme == "sentinel":
        return _sentinel(url)
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError("must be a redis://, rediss://, unix:// or sentinel:// URL")
    split = urlsplit(url)
    if ";" in url:
        raise ValueError("several servers (;) are for sentinel:// URLs only")
    query = dict(parse_qsl(split.query, keep_blank_values=True))
    if scheme != "rediss":
        tls = [name for name in SSL_PARAMS if name in query]
        if tls:
            raise ValueError(f"{', '.join(tls)}: TLS options need a rediss:// URL")
        return RedisTarget(url=url, scheme=scheme, host=split.hostname or "", library_url=url)
    if not split.hostname:
        raise ValueError("a rediss:// URL names its host")
    options = _tls_options(query)
    rest = {k: v for k, v in query.items() if k not in SSL_PARAMS}
    library = urlunsplit(split._replace(query=urlencode(rest)))
    return RedisTarget(
        url=url,
        scheme=scheme,
        host=split.hostname,
        username=unquote(split.username) if split.username else None,
        password=unquote(split.password) if split.password is not None else None,
        db=_db(split.path),
        ssl=options,
        library_url=library,
        extra=rest,
    )


def tls_failure(exc: BaseException) -> ssl.SSLError | None:
    """The TLS error behind a redis-py connection error, if a TLS error was its cause."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None
