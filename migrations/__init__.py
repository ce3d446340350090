"""Alembic environment (``env.py``, ``script.py.mako``) and ``versions/``.

A package so that a built wheel ships it, installed as ``tasks.migrations`` (setup.py:
the wheel claims no top-level ``migrations``): ``tasks.platform.migrate`` finds it with
importlib.resources wherever Keel is installed. Nothing imports its modules; Alembic
loads them by path.
"""
