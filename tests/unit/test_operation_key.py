"""The operation key is sha256 over the JSON of the five fields, as a JS producer computes it."""

from __future__ import annotations

import hashlib

from tasks.reports.operation_key import operation_key


def test_matches_json_stringify_of_the_fields():
    expected = hashlib.sha256(b'["report.generate.v1","acme","alice","q3",1000]').hexdigest()
    assert operation_key("acme", "alice", "q3", 1000) == expected


def test_every_field_changes_the_key():
    base = operation_key("acme", "alice", "q3", 1000)
    variants = [
        operation_key("globex", "alice", "q3", 1000),
        operation_key("acme", "bob", "q3", 1000),
        operation_key("acme", "alice", "q4", 1000),
        operation_key("acme", "alice", "q3", 1001),
    ]
    assert base not in variants and len(set(variants)) == 4
