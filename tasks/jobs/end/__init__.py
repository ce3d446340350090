"""How a job ends: a run's outcome recorded (``finish``), what it triggers (``canvas``),
cancels and revokes, stalled runs given up.

Every end without a result goes through ``ending.ended``.
"""
