"""What Keel's Sentinel transport relies on in kombu's (``tasks.platform.kombu_members``)."""

from __future__ import annotations

import inspect

import pytest

from tasks.platform import kombu_members, transport

READS = [(where, name) for where, names in kombu_members.SENTINEL_READS.items() for name in names]


@pytest.mark.parametrize(("where", "name"), READS)
def test_kombu_reads_each_attribute_keel_sets_on_its_sentinel_channel(where, name):
    cls, method = where
    source = inspect.getsource(getattr(cls, method))
    assert f"getattr(self, '{name}'" in source or f'getattr(self, "{name}"' in source
    assert name in cls.from_transport_options  # a transport option may still replace it


def test_keels_sentinel_channel_is_keels_channel_on_kombus_sentinel_pools():
    mro = transport.SentinelChannel.__mro__
    assert mro.index(transport.Channel) < mro.index(transport.kombu_redis.SentinelChannel)
    assert transport.SentinelChannel.QoS is transport.QoS
    assert transport.SentinelChannel._get_pool is transport.kombu_redis.SentinelChannel._get_pool
    assert transport.SentinelTransport.default_port == 26379
