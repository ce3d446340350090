"""Keel's benchmarks: Keel beside bare Celery, raw provider calls and a trivial endpoint.

Every claim is a ratio of two figures measured in one run on one machine,
alternating A and B, so the noise of a shared host hits both sides alike.
Run ``python -m bench --help``.
"""
