"""What a job is: its record and states, options, owner, job types, errors and formats.

The bottom layer: imports nothing else of the job layer.
"""
