"""The API's request metrics through gunicorn: every worker process's requests reach one
``/metrics`` answer, within the flush interval (``web.http_metrics``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from tests.support.client import metrics_headers, unique
from tests.support.stack import WebProcess, wait_for
from web.http_metrics import FLUSH_S

REQUESTS = 60


@pytest.fixture(scope="module")
def web(stack) -> Iterator[WebProcess]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KEEL_WEB_WORKERS", "2")
        patch.setenv("KEEL_LOG_FORMAT", "json")  # access lines with the serving process's pid
        server = WebProcess(stack.home)
        server.start()
    yield server
    server.stop()


def test_every_worker_process_counts_its_requests_into_one_scrape(web: WebProcess):
    assert len(web.worker_pids()) == 2
    route = f"/{unique('probe')}"  # a path no route matches: counted as <unmatched>, 404

    def scraped() -> float:
        text = requests.get(f"{web.url}/metrics", headers=metrics_headers(), timeout=10).text
        labels = 'method="GET",route="<unmatched>",status="404"'
        for line in text.splitlines():
            if line.startswith(f"keel_http_request_duration_seconds_count{{{labels}}}"):
                return float(line.rpartition(" ")[2])
        return 0.0

    def served_by(tag: str) -> list[int]:
        """The process of each access line answering a request tagged ``tag``."""
        pids = []
        for line in web.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{") and tag in line:
                record = json.loads(line)
                if str(record.get("request_id", "")).startswith(tag):
                    pids.append(record["pid"])
        return pids

    before = scraped()
    # When requests are spread over both processes (side by side, new connections), in
    # rounds of 60 until each process has answered some (the kernel picks the acceptor)
    tag = unique("spread")
    sent = 0

    def one(i: int) -> int:
        headers = {"X-Request-ID": f"{tag}-{i}"}
        return requests.get(web.url + route, headers=headers, timeout=10).status_code

    with ThreadPoolExecutor(8) as pool:
        while sent < REQUESTS * 20:
            statuses = list(pool.map(one, range(sent, sent + REQUESTS)))
            assert statuses == [404] * REQUESTS
            sent += REQUESTS
            logged = wait_for(lambda n=sent: len(served_by(tag)) == n and served_by(tag))
            if len(set(logged)) == 2:
                break
    assert set(served_by(tag)) == set(web.worker_pids())
    # Then within the flush interval, one scrape counts them all, once
    wait_for(lambda: scraped() >= before + sent, timeout=FLUSH_S * 3, interval=0.5)
    assert scraped() == before + sent
