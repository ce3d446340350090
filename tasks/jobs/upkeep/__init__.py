"""What keeps the records and the broker in step while workers run: the maintenance
loop (promotion, stalled runs, reconciling, broker resets) and liveness."""
