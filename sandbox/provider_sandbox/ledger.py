"""The provider's own account of what it accepted, dropped and sent.

Campaign tests check Keel's invariants (one group per generation, one send
per group, each message in at most one group) against this ledger rather
than against Keel's records, because only the provider knows what really
happened: silent drops and sends whose response was lost show up here only.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from provider_sandbox.errors import GroupNotFound

OVER_ACCEPTED_SAMPLE = 20
GROUPS_SQL = """
SELECT g.group_id, g.name, g.created_at, g.deleted_at, g.count, g.duplicates, g.sent_at,
       g.rejected_sends,
       (SELECT COUNT(*) FROM sends s WHERE s.group_id = g.group_id),
       (SELECT COALESCE(SUM(s.message_count), 0) FROM sends s WHERE s.group_id = g.group_id),
       (SELECT COUNT(*) FROM drops d WHERE d.group_id = g.group_id)
FROM groups g
"""
# Acceptances per message id, over every group, for the ids in scope.
PER_MESSAGE_SQL = "SELECT message_id, COUNT(*) AS n FROM messages {scope} GROUP BY message_id"
IN_GROUP_SCOPE = "WHERE message_id IN (SELECT message_id FROM messages WHERE group_id = ?)"


def ledger(db: sqlite3.Connection, *, group_id: str | None, summary: bool) -> dict[str, Any]:
    """The whole ledger, or one group's; ``summary`` leaves out every message list."""
    groups = _groups(db, group_id)
    if group_id is not None and not groups:
        raise GroupNotFound(details=[{"groupId": group_id}])
    scope, params = (IN_GROUP_SCOPE, (group_id,)) if group_id else ("", ())
    per_message_sql = PER_MESSAGE_SQL.format(scope=scope)
    body: dict[str, Any] = {"groups": groups}
    if not summary:
        for group in groups:
            group["messages"] = _ids(db, "messages", group["groupId"])
            group["droppedMessages"] = _ids(db, "drops", group["groupId"])
        body["messages"] = dict(db.execute(per_message_sql, params).fetchall())
    body["totals"] = {**_group_totals(groups), **_message_totals(db, per_message_sql, params)}
    return body


def _groups(db: sqlite3.Connection, group_id: str | None) -> list[dict[str, Any]]:
    where = ("WHERE g.group_id = ? ", (group_id,)) if group_id else ("", ())
    rows = db.execute(GROUPS_SQL + where[0] + "ORDER BY g.rowid", where[1]).fetchall()
    return [_group(row) for row in rows]


def _group(row: tuple) -> dict[str, Any]:
    (
        group_id,
        name,
        created_at,
        deleted_at,
        count,
        duplicates,
        sent_at,
        rejected_sends,
        send_count,
        sent_messages,
        dropped,
    ) = row
    return {
        "groupId": group_id,
        "name": name,
        "createdAt": created_at,
        "deleted": deleted_at is not None,
        "deletedAt": deleted_at,
        "count": count,
        "duplicates": duplicates,
        "dropped": dropped,
        "sent": sent_at is not None,
        "sentAt": sent_at,
        "sendCount": send_count,
        "sentMessages": sent_messages,
        "rejectedSends": rejected_sends,
    }


def _ids(db: sqlite3.Connection, table: str, group_id: str) -> list[str]:
    sql = f"SELECT message_id FROM {table} WHERE group_id = ? ORDER BY message_id"
    return [row[0] for row in db.execute(sql, (group_id,))]


def _group_totals(groups: list[dict[str, Any]]) -> dict[str, int]:
    def total(key: str) -> int:
        return sum(group[key] for group in groups)

    return {
        "groups": len(groups),
        "deletedGroups": sum(group["deleted"] for group in groups),
        "sentGroups": sum(group["sent"] for group in groups),
        "sends": total("sendCount"),
        "rejectedSends": total("rejectedSends"),
        "accepted": total("count"),
        "sentMessages": total("sentMessages"),
        "duplicates": total("duplicates"),
        "dropped": total("dropped"),
    }


def _message_totals(db: sqlite3.Connection, per_message_sql: str, params: tuple) -> dict[str, Any]:
    distinct, several, most = db.execute(
        f"SELECT COUNT(*), COALESCE(SUM(n > 1), 0), COALESCE(MAX(n), 0) FROM ({per_message_sql})",
        params,
    ).fetchone()
    sample = db.execute(
        f"SELECT message_id FROM ({per_message_sql}) WHERE n > 1 ORDER BY message_id LIMIT ?",
        (*params, OVER_ACCEPTED_SAMPLE),
    ).fetchall()
    return {
        "distinctMessages": distinct,
        "messagesInSeveralGroups": several,
        "maxAcceptancesPerMessage": most,
        "messagesInSeveralGroupsSample": [row[0] for row in sample],
    }
