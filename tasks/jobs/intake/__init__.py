"""Intake: how a job gets in: recorded (one or many), given its message, published or parked.

Also the mapping of Celery's call options to a job's options (``celery_options``)
and a tenant's admission (``tenancy``).
"""
