"""Examples of jobs of your own, run with ``keel up --include examples.<module>``."""
