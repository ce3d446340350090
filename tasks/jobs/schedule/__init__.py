"""Job schedulers (BullMQ's Job Scheduler) and the Celery beat scheduler that fires them."""
