"""``keel limits keys list / show / set / clear``: the system scope's command line for key
limit overrides, against the real records (what the workers read)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from keel.cli import main as keel
from tests.support.client import unique

pytestmark = pytest.mark.usefixtures("stack")
REASON = "partner calls halved for the incident"
JOB = "test.keyed3"  # 3 per partner, 1000 starts a second per partner


def cli(*args: str):
    return CliRunner().invoke(keel, ["limits", "keys", *args])


def lines(result) -> list[dict]:
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.strip().splitlines()]


def test_set_show_list_and_clear_an_override():
    key, tenant = unique("p"), unique("t")
    # When any tenant's keys like it get 2 and a rate, then one tenant's key no max at all
    [first] = lines(
        cli(
            "set",
            JOB,
            "--key",
            f"{key}*",
            "--max-running",
            "2",
            "--rate",
            "5/1000",
            "--reason",
            REASON,
        )
    )
    [second] = lines(
        cli(
            "set",
            JOB,
            "--tenant",
            tenant,
            "--key",
            key,
            "--max-running",
            "none",
            "--reason",
            REASON,
            "--by",
            "alice",
        )
    )
    # Then each prints the job type's limits and its overrides, most specific first
    mine = [o for o in second["overrides"] if o["key"].startswith(key)]
    assert [(o["tenant"], o["key"], o["maxRunning"], o["setBy"]) for o in mine] == [
        (tenant, key, None, "alice"),
        ("*", f"{key}*", 2, mine[1]["setBy"]),
    ]
    assert mine[1]["setBy"].startswith("cli:")
    assert [o["maxRunning"] for o in first["overrides"] if o["key"] == f"{key}*"] == [2]
    # And what holds for the tenant's key says which override decides each limit
    shown, in_force, *changes = lines(cli("show", JOB, "--key", key, "--tenant", tenant))
    assert shown == second
    assert in_force["inForce"] == {
        "tenant": tenant,
        "key": key,
        "maxRunning": None,
        "rate": {"max": 5, "durationMs": 1000},
        "maxRunningFrom": {"tenant": tenant, "key": key},
        "rateFrom": {"tenant": "*", "key": f"{key}*"},
    }
    assert [(c["key"], c["after"]) for c in changes[:2]] == [
        (key, {"maxRunning": None}),
        (f"{key}*", {"maxRunning": 2, "rate": {"max": 5, "durationMs": 1000}}),
    ]
    assert second in lines(cli("list"))
    # And cleared, the tenant's key is decided by the pattern again
    [cleared] = lines(cli("clear", JOB, "--tenant", tenant, "--key", key, "--reason", REASON))
    assert [o["key"] for o in cleared["overrides"] if o["key"].startswith(key)] == [f"{key}*"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((JOB, "--key", "p", "--reason", REASON), "--max-running or --rate"),
        ((JOB, "--key", "p", "--max-running", "0", "--reason", REASON), "--max-running"),
        ((JOB, "--key", "p", "--max-running", "two", "--reason", REASON), "--max-running"),
        ((JOB, "--key", "p", "--rate", "10", "--reason", REASON), "--rate"),
        ((JOB, "--key", "p", "--max-running", "2", "--reason", "short"), "--reason"),
        (
            (JOB, "--key", "p", "--tenant", "a b", "--max-running", "2", "--reason", REASON),
            "--tenant",
        ),
        (
            ("test.echo", "--key", "p", "--max-running", "2", "--reason", REASON),
            "declares a key limit",
        ),
        (
            ("test.keyed_rated", "--key", "p", "--max-running", "2", "--reason", REASON),
            "--max-running",
        ),
    ],
)
def test_a_bad_value_is_one_line_naming_the_option(args, says):
    result = cli("set", *args)
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
