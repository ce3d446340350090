"""``keel queues limits list / show / set / clear``: the system scope's command line for
queue limits set live, against the real records (what the workers read)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from keel.cli import main as keel
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")
REASON = "partner calls halved for the incident"


def cli(*args: str):
    return CliRunner().invoke(keel, ["queues", "limits", *args])


def lines(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.strip().splitlines()]


def test_set_show_list_and_clear_a_queues_limits():
    queue = unique("q")
    # When a queue's concurrency and rate are set, then replaced by "no rate limit" alone
    [first] = lines(
        cli("set", queue, "--concurrency", "2", "--rate", "10/1000", "--reason", REASON)
    )
    [lifted] = lines(cli("set", queue, "--rate", "none", "--reason", REASON, "--by", "alice"))
    # Then each prints the limits in force
    assert first["effective"] == {"concurrency": 2, "rate": {"max": 10, "durationMs": 1000}}
    assert lifted["effective"] is None  # a set replaces the override: concurrency's default

    assert (lifted["source"], lifted["override"]["setBy"]) == ("live", "alice")
    # And the list and the audit show them
    assert lifted in lines(cli("list"))
    shown, *changes = lines(cli("show", queue))
    assert shown == lifted
    assert [(c["actor"], c["after"]) for c in changes] == [
        ("alice", {"rate": None}),
        (first["override"]["setBy"], {"concurrency": 2, "rate": {"max": 10, "durationMs": 1000}}),
    ]
    assert first["override"]["setBy"].startswith("cli:")
    # And cleared, nothing is set live any more
    [cleared] = lines(cli("clear", queue, "--reason", REASON))
    assert (cleared["source"], cleared["override"]) == ("none", None)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--reason", REASON), "--concurrency or --rate"),
        (("--concurrency", "0", "--reason", REASON), "--concurrency"),
        (("--concurrency", "two", "--reason", REASON), "--concurrency"),
        (("--rate", "10", "--reason", REASON), "--rate"),
        (("--concurrency", "2", "--reason", "short"), "--reason"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option(args, says):
    queue = unique("q")
    result = cli("set", queue, *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert lines(cli("show", queue))[1:] == []
