"""The webhook rules as pure logic (``tasks.jobs.model.webhooks``): signatures, delivery ids,
the event a job's end posts, and which URLs and addresses a delivery may reach."""

from __future__ import annotations

import ipaddress
from types import SimpleNamespace

import pytest

from tasks.jobs.model import webhooks
from tasks.jobs.model.webhooks import WebhookRefused, check_address, check_url
from tasks.platform.setting_types import parse_networks

SECRET = "whsec_test"


def test_a_signature_holds_for_its_body_and_time_only():
    body = b'{"type":"job.completed"}'
    header = webhooks.sign(SECRET, 1_700_000_000, body)
    assert header.startswith("t=1700000000,v1=") and len(header.split("v1=")[1]) == 64
    assert webhooks.verify(SECRET, header, body, now=1_700_000_100)
    assert not webhooks.verify(SECRET, header, body + b" ", now=1_700_000_100)  # tampered
    assert not webhooks.verify("whsec_other", header, body, now=1_700_000_100)
    assert not webhooks.verify(SECRET, header, body, now=1_700_000_301)  # replayed late
    assert not webhooks.verify(SECRET, "v1=abc", body, now=1_700_000_000)
    assert not webhooks.verify(SECRET, "t=soon,v1=abc", body, now=1_700_000_000)


def test_one_delivery_id_per_endpoint_job_and_event():
    first = webhooks.delivery_id("wh_1", "job-1", "job.completed")
    assert first == webhooks.delivery_id("wh_1", "job-1", "job.completed")
    others = {
        webhooks.delivery_id("wh_2", "job-1", "job.completed"),
        webhooks.delivery_id("wh_1", "job-2", "job.completed"),
        webhooks.delivery_id("wh_1", "job-1", "job.failed"),
    }
    assert first not in others and len(others) == 3
    assert first.startswith("webhook:wh_1:") and len(first) <= 200


def test_the_event_of_a_jobs_end():
    job = SimpleNamespace(id="j1", name="report.generate", queue="reports")
    done = webhooks.job_event(job, "completed", reason=None, result={"url": "s3://x"})
    assert done == {
        "type": "job.completed",
        "data": {
            "jobId": "j1",
            "name": "report.generate",
            "queue": "reports",
            "state": "completed",
            "result": {"url": "s3://x"},
        },
    }
    big = webhooks.job_event(job, "completed", reason=None, result="x" * 20_000)
    assert "result" not in big["data"] and big["data"]["resultOmitted"] is True
    failed = webhooks.job_event(job, "failed", reason="boom", result=None)
    assert failed["data"]["failedReason"] == "boom" and "result" not in failed["data"]
    cancelled = webhooks.job_event(job, "cancelled", reason="by alice", result=None)
    assert cancelled["data"]["reason"] == "by alice"


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/keel",
        "http://hooks.example.com:8080/a?b=c",
        "https://93.184.216.34/hook",
        "https://[2606:2800:220:1:248:1893:25c8:1946]/hook",
    ],
)
def test_public_urls_are_taken(url):
    assert check_url(url, ()) == url


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/hook",
        "http://localhost:8080/hook",
        "http://api.localhost/hook",
        "http://10.0.0.1/hook",
        "http://172.16.5.4/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://100.64.0.1/hook",
        "http://0.0.0.0/hook",
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://[fd12::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",
        "http://224.0.0.1/hook",
        "ftp://hooks.example.com/x",
        "https:///nohost",
        "https://user:secret@hooks.example.com/x",
        "http://[fe80::1/hook",
        "http://[64:ff9b::10.0.0.5]/hook",  # NAT64 of a private address
        "http://[64:ff9b::a9fe:a9fe]/hook",  # NAT64 of 169.254.169.254
        "http://[2002:a00:5::1]/hook",  # 6to4 of 10.0.0.5
        "http://[::127.0.0.1]/hook",  # IPv4-compatible
        "http://[::ffff:0:127.0.0.1]/hook",  # SIIT
        "http://[fec0::1]/hook",  # site-local
        "http://localhost./hook",
        "http://a..b/hook",
        "http://[not-an-address]/hook",
    ],
)
def test_other_urls_are_refused(url):
    with pytest.raises(WebhookRefused):
        check_url(url, ())


def test_an_allowed_network_is_reached_and_no_other():
    allowed = parse_networks("10.0.0.0/8, 127.0.0.0/8 ::1/128")
    assert check_url("http://10.1.2.3/hook", allowed)
    assert check_url("http://localhost:9/hook", allowed)
    check_address(ipaddress.ip_address("::1"), allowed)
    with pytest.raises(WebhookRefused):
        check_address(ipaddress.ip_address("192.168.0.1"), allowed)
    with pytest.raises(ValueError, match="not a network"):
        parse_networks("10.0.0.0/33")
