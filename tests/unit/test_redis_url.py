"""KEEL_REDIS_URL's forms: what Keel's clients, Celery's broker and its result backend get."""

from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError
from redis.sentinel import SentinelConnectionPool

from tasks import celeryconfig
from tasks.platform.config import Settings
from tasks.platform.redis_url import parse

SENTINELS = (
    "sentinel://:pw@10.0.0.1:26379;sentinel://10.0.0.2;sentinel://10.0.0.3:26380/2?master_name=main"
)


def settings(url: str) -> Settings:
    return Settings(redis_url=url, database_url="postgresql://k@localhost/k")


def test_a_plain_url_is_given_to_every_library_as_written():
    url = "redis://:secret@127.0.0.1:6390/3"
    target = parse(url)
    assert (target.library_url, target.ssl, target.is_sentinel) == (url, None, False)
    broker = celeryconfig.redis_broker(settings(url))
    assert broker["broker_url"] == url
    assert broker["broker_transport"] == "tasks.platform.transport:Transport"
    assert (
        "broker_use_ssl" not in broker and "master_name" not in broker["broker_transport_options"]
    )
    assert celeryconfig.result_backend(settings(url)) == {
        "result_backend": f"tasks.jobs.calls.result_backend:KeelBackend+{url}"
    }


def test_a_sentinel_url_names_each_sentinel_and_the_primary_and_every_part_carries_the_rest():
    target = parse(SENTINELS)
    assert target.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26379), ("10.0.0.3", 26380))
    assert (target.master_name, target.password, target.db) == ("main", "pw", 2)
    assert target.library_url == (
        "sentinel://:pw@10.0.0.1:26379/2;sentinel://:pw@10.0.0.2:26379/2;"
        "sentinel://:pw@10.0.0.3:26380/2"
    )
    broker = celeryconfig.redis_broker(settings(SENTINELS))
    assert broker["broker_transport"] == "tasks.platform.transport:SentinelTransport"
    assert broker["broker_url"] == target.library_url
    assert broker["broker_transport_options"]["master_name"] == "main"
    assert celeryconfig.result_backend(settings(SENTINELS)) == {
        "result_backend": "tasks.jobs.calls.result_backend:KeelSentinelBackend+"
        + target.library_url,
        "result_backend_transport_options": {"master_name": "main"},
    }
    # Keel's own client asks the sentinels for the primary (no connection made here)
    client = target.client(socket_timeout=0.5)
    assert isinstance(client.connection_pool, SentinelConnectionPool)
    assert client.connection_pool.service_name == "main"
    assert client.connection_pool.connection_kwargs["password"] == "pw"


def test_a_rediss_url_gives_the_same_tls_options_to_each_library():
    url = "rediss://keel:pw@redis.internal:6380/1?ssl_ca_certs=/etc/ca.pem&ssl_certfile=/c.crt&ssl_keyfile=/c.key"
    target = parse(url)
    expected = {
        "ssl_cert_reqs": ssl.CERT_REQUIRED,
        "ssl_ca_certs": "/etc/ca.pem",
        "ssl_certfile": "/c.crt",
        "ssl_keyfile": "/c.key",
    }
    assert target.ssl == expected
    assert target.library_url == "rediss://keel:pw@redis.internal:6380/1"
    broker = celeryconfig.redis_broker(settings(url))
    assert (broker["broker_url"], broker["broker_use_ssl"]) == (target.library_url, expected)
    backend = celeryconfig.result_backend(settings(url))
    assert backend["redis_backend_use_ssl"] == expected
    assert backend["result_backend"].endswith("KeelBackend+rediss://keel:pw@redis.internal:6380/1")
    kwargs = target.client().connection_pool.connection_kwargs
    assert (kwargs["ssl_ca_certs"], kwargs["username"], kwargs["db"]) == ("/etc/ca.pem", "keel", 1)
    assert parse("rediss://h/0?ssl_cert_reqs=none").ssl == {"ssl_cert_reqs": ssl.CERT_NONE}


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("sentinel://10.0.0.1:26379", "master_name"),
        ("sentinel://10.0.0.1;sentinel://10.0.0.2/0?master_name=a&ssl_ca_certs=/x", "TLS through"),
        ("sentinel://:a@h1;sentinel://:b@h2?master_name=m", "different passwords"),
        ("redis://h/0?ssl_ca_certs=/x", "need a rediss://"),
        ("rediss://h/0?ssl_cert_reqs=maybe", "ssl_cert_reqs"),
        ("rediss://h/0?ssl_certfile=/c.crt", "both ssl_certfile and ssl_keyfile"),
        ("redis://h1;redis://h2", "sentinel:// URLs only"),
        ("http://h", "must be a redis://"),
    ],
)
def test_a_malformed_url_stops_the_process_naming_the_setting(url, why):
    with pytest.raises(ValidationError, match=why) as refused:
        settings(url)
    assert "redis_url" in str(refused.value)
