"""Alembic environment (``env.py``, ``script.py.mako``) and ``versions/``.

A package so that a built wheel ships it: ``tasks.platform.migrate`` finds it with
importlib.resources wherever Keel is installed. Nothing imports its modules;
Alembic loads them by path.
"""
