"""The documentation's generated references: ``python -m docs.gen`` writes them.

Two pages of the site are produced from the code rather than written by hand,
so that they cannot drift from it:

- ``docs/reference/http-api.md`` from the OpenAPI document the web app serves
  (``GET /api/v1/openapi.json``), fetched through the app itself;
- ``docs/reference/configuration.md`` from ``tasks.platform.config.Settings``: every field,
  its ``KEEL_*`` name, type, default and description.

The pages are committed (readable without building the site);
``python -m docs.gen --check`` regenerates them in memory and fails on any
difference, and ``tests/docs`` runs that check in the fast tier.
"""
