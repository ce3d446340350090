"""The private members of kombu's Redis transport that Keel relies on, in one place.

Keel's transport (``tasks.platform.transport``), its batched publishing
(``tasks.platform.pipelined``) and
the prefetch watch (``tasks.jobs.run.slots``) override or call members of kombu's Redis
``Channel`` and ``QoS`` that kombu does not promise to keep. Each is listed here with the
parameters Keel passes or receives, and ``tests/unit/test_kombu_members.py`` fails on a
kombu release that renames one, drops it or changes those parameters: ``setup.cfg``'s
kombu range is the releases that test ran on. A new use of a private member is added
here first.
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis

# Methods Keel's subclasses replace: kombu calls them with these parameters (first ones).
OVERRIDDEN: dict[tuple[type, str], tuple[str, ...]] = {
    (kombu_redis.Channel, "_put"): ("self", "queue", "message"),
    (kombu_redis.Channel, "_get"): ("self", "queue"),
    (kombu_redis.Channel, "_brpop_read"): ("self",),
    (kombu_redis.Channel, "_create_client"): ("self", "asynchronous"),
    (kombu_redis.Channel, "_next_delivery_tag"): ("self",),
    (kombu_redis.Channel, "_deliver_fanout_message"): ("self", "message", "exchange"),
    (kombu_redis.Channel, "conn_or_acquire"): ("self", "client"),
    (kombu_redis.QoS, "append"): ("self", "message", "delivery_tag"),
    (kombu_redis.QoS, "ack"): ("self", "delivery_tag"),
    (kombu_redis.QoS, "reject"): ("self", "delivery_tag", "requeue"),
    (kombu_redis.QoS, "restore_by_tag"): ("self", "tag", "client", "leftmost"),
}

# Methods Keel calls, with these parameters (first ones).
CALLED: dict[tuple[type, str], tuple[str, ...]] = {
    (kombu_redis.Channel, "_q_for_pri"): ("self", "queue", "pri"),
    (kombu_redis.Channel, "_get_message_priority"): ("self", "message", "reverse"),
    (kombu_redis.Channel, "_inplace_augment_message"): (
        "self",
        "message",
        "exchange",
        "routing_key",
    ),
    (kombu_redis.Channel, "_get_publish_topics"): ("self", "exchange", "routing_key"),
    (kombu_redis.Channel, "_do_restore_message"): (
        "self",
        "payload",
        "exchange",
        "routing_key",
        "pipe",
        "leftmost",
    ),
    (kombu_redis.QoS, "_remove_from_indices"): ("self", "delivery_tag", "pipe"),
}

# kombu's Sentinel channel, under Keel's (``tasks.platform.transport.SentinelChannel``): the
# attributes kombu reads from the channel (``getattr(self, name, ...)``) in the method named,
# which Keel sets before kombu's ``__init__`` builds the first pool.
SENTINEL_READS: dict[tuple[type, str], tuple[str, ...]] = {
    (kombu_redis.SentinelChannel, "_sentinel_managed_pool"): ("master_name",),
}

# Attributes Keel reads or calls that kombu sets on each instance (``self.<name>`` in its
# classes' code), and the class properties it reads.
ATTRIBUTES: dict[type, tuple[str, ...]] = {
    kombu_redis.Channel: ("_pool", "_expires", "_fanout_to_queue"),
    kombu_redis.QoS: ("_delivered", "_dirty", "_quick_ack"),
}
PROPERTIES: dict[type, tuple[str, ...]] = {
    kombu_redis.Channel: ("pool",),
}
