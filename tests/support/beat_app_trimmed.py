"""``tests.support.beat_app`` after its ``nightly-echo`` entry was deleted from the config."""

from __future__ import annotations

from tests.support.beat_app import app

app.conf.beat_schedule = {
    name: entry for name, entry in app.conf.beat_schedule.items() if name != "nightly-echo"
}
