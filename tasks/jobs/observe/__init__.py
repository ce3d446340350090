"""What can be seen of jobs: events, metrics, reads of the records and of the broker."""
