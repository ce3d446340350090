"""Keel's packages, for setuptools (everything else is in setup.cfg).

The wheel installs three top-level packages: ``keel``, ``tasks`` and ``web``. The
repository keeps the Alembic environment and versions at its top (``migrations/``);
they install as ``tasks.migrations`` (``package_dir``), so the wheel claims no
generic top-level name, and ``tasks.platform.migrate`` finds them through
importlib.resources in a wheel and in an editable install alike. setup.cfg alone
cannot say this: its ``find:`` finds packages by folder, never one mapped elsewhere.
"""

from setuptools import find_namespace_packages, setup

PACKAGES = ["keel", "keel.*", "tasks", "tasks.*", "web", "web.*"]

setup(
    # Namespace packages too: the folders that hold only data (the dashboard's templates
    # and assets) are named, as setuptools wants every folder it ships to be.
    packages=[
        *find_namespace_packages(include=PACKAGES, exclude=["*.__pycache__"]),
        "tasks.migrations",
        "tasks.migrations.versions",
    ],
    package_dir={"tasks.migrations": "migrations"},
)
