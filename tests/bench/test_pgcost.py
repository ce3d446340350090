"""``python -m bench.pgcost``: its variants are what they say, and its parts are their
differences. The figures themselves are never checked (a shared host's CPU says nothing);
the WAL is, for every index entry and counter row is WAL whatever the host."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import pgcost
from tests.support.bench_runs import run_bench


def _sample(insert: float, claim: float, completion: float) -> dict:
    return {
        kind: {"cpu_us": cpu, "wal_bytes": 10 * cpu}
        for kind, cpu in (("insert", insert), ("claim", claim), ("completion", completion))
    }


def test_parts_are_differences_of_the_variants_medians() -> None:
    rounds = {
        pgcost.SHIPPED: [_sample(200, 250, 250), _sample(210, 240, 250), _sample(900, 900, 900)],
        pgcost.NO_TRIGGERS: [_sample(180, 220, 200)] * 3,
        pgcost.BARE: [_sample(150, 180, 150)] * 3,
        pgcost.ASYNC: [_sample(150, 200, 170)] * 3,
        pgcost.batch_name(8): [_sample(200, 100, 80)] * 3,
    }
    costs = pgcost.summary(rounds)
    shipped = costs["variants"][pgcost.SHIPPED]
    assert shipped["job"]["cpu_us"] == 700  # the median job, not the sum of the medians
    assert shipped["insert"]["cpu_us"] == 210
    parts = costs["parts"]
    assert parts["counter triggers"]["cpu_us"] == 700 - 600
    assert parts["secondary indexes"]["cpu_us"] == 600 - 480
    assert parts["flushing each commit's WAL before it answers"]["cpu_us"] == 700 - 520
    assert parts["counter triggers"]["share"] == pytest.approx(100 / 700)
    # A batch saves on claims and completions only: its insert's noise is not counted.
    assert parts["saved by claims and completions 8 a statement"]["cpu_us"] == 500 - 180
    table = pgcost.markdown(
        costs,
        {
            "jobs": 3,
            "runs": 3,
            "commit": "c",
            "started": "s",
            "cpus": 2,
            "loadavg": "0",
            "server": "x",
            "databases": {pgcost.SHIPPED: {"indexes": 15}},
        },
    )
    assert "; 15 indexes on `jobs` as shipped." in table
    assert "| as shipped | 210 µs | 250 µs | 250 µs | 700 µs | 7,000 B |" in table
    assert "- counter triggers: 100 µs a job (14% of the statements' server CPU per job)" in table


def test_batched_statements_take_every_id_once() -> None:
    texts = pgcost.statements()
    batched = pgcost.batched(texts)
    assert batched["insert"] == texts["insert"]
    for kind in ("claim", "completion"):
        assert "%(id)s" in texts[kind] and "%(id)s" not in batched[kind]
        assert batched[kind].count("= ANY(%(ids)s)") == 1
    ids = [f"job-{i}" for i in range(10)]
    params = pgcost.parameters(ids, batch=4)
    for kind in ("claim", "completion"):
        chunks = [p["ids"] for p in params[kind]()]
        assert chunks == [ids[0:4], ids[4:8], ids[8:10]]  # the short last one too
    one = pgcost.parameters(ids)
    assert [p["id"] for p in one["claim"]()] == ids == [p["id"] for p in one["completion"]()]
    inserts = list(one["insert"]())
    assert [p["id"] for p in inserts] == ids
    # The bound of the jobs-ahead count Keel's add passes (tasks.jobs.intake.enqueue).
    assert {p["up_to"] for p in inserts} == {16}


@pytest.mark.timeout(150)
def test_a_short_run_measures_four_variants_on_its_own_server(tmp_path: Path) -> None:
    out = run_bench(
        tmp_path, "bench.pgcost", "--jobs", "300", "--runs", "1", "--batch", "4", timeout=140
    )
    [report] = out.glob("pgcost-*.json")
    body = json.loads(report.read_text())
    assert (out / report.name.replace(".json", ".md")).read_text().startswith("## Postgres")
    databases = body["meta"]["databases"]
    indexes = databases[pgcost.SHIPPED]["indexes"]
    assert indexes > 1
    assert databases == {
        pgcost.SHIPPED: {"indexes": indexes, "count_triggers": 3, "synchronous_commit": "on"},
        pgcost.NO_TRIGGERS: {"indexes": indexes, "count_triggers": 0, "synchronous_commit": "on"},
        pgcost.BARE: {"indexes": 1, "count_triggers": 0, "synchronous_commit": "on"},
        pgcost.ASYNC: {"indexes": indexes, "count_triggers": 3, "synchronous_commit": "off"},
    }
    variants = body["per_job"]["variants"]
    assert list(variants) == [*pgcost.VARIANTS, pgcost.batch_name(4)]
    wal = {name: variant["job"]["wal_bytes"] for name, variant in variants.items()}
    # Counter rows and index entries are WAL: each variant without them writes less, by
    # about 1,100 and 1,700 bytes a job (4,400 as shipped); the flush changes no write.
    assert wal[pgcost.SHIPPED] - wal[pgcost.NO_TRIGGERS] > 500
    assert wal[pgcost.NO_TRIGGERS] - wal[pgcost.BARE] > 800
    assert abs(wal[pgcost.ASYNC] - wal[pgcost.SHIPPED]) < 0.1 * wal[pgcost.SHIPPED]
    # Batched, the claims and completions write the same rows, in fewer commits.
    assert wal[pgcost.batch_name(4)] < wal[pgcost.SHIPPED] + 0.1 * wal[pgcost.SHIPPED]
