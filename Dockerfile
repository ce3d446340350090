# One image for every Keel process; compose picks the command.
#
# The image is the wheel: the first stage builds Keel's wheel (and the provider sandbox's,
# sandbox/, which compose's demo profile runs) from the whole source tree; the second
# installs into a virtualenv the pinned dependencies of requirements/image.lock (what a
# container runs: Keel's requirements with its flower and otel extras, no embedded
# servers; docs/operations/docker.md says how to regenerate it), then those wheels, both
# with --no-deps, and keeps nothing else of the sources, so `celery -A keel` in the empty
# working folder imports the installed packages, migrations and templates included.
#
# BASE_IMAGE: any Debian-like image with Python >= 3.11 as `python3` (with venv).
# The default is the official one; the container tests pass a debootstrapped base.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS wheel
WORKDIR /src
COPY . .
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip wheel --no-cache-dir -q --no-deps -w /dist . ./sandbox \
    && ls /dist/keel_jobs-*.whl /dist/keel_provider_sandbox-*.whl

FROM ${BASE_IMAGE}
# A virtualenv: the same on every base, and outside a distribution's own Python packages.
RUN python3 -m venv /opt/keel
# The dependencies, exactly as locked (a layer of their own: rebuilt when the lock changes).
COPY requirements/image.lock /tmp/image.lock
RUN /opt/keel/bin/pip install --no-cache-dir -q --disable-pip-version-check --no-deps \
        -r /tmp/image.lock \
    && rm /tmp/image.lock
COPY --from=wheel /dist/ /tmp/dist/
# Keel and the sandbox, nothing more; pip check: the lock holds every requirement they have.
RUN /opt/keel/bin/pip install --no-cache-dir -q --disable-pip-version-check --no-deps \
        /tmp/dist/keel_jobs-*.whl /tmp/dist/keel_provider_sandbox-*.whl \
    && /opt/keel/bin/pip check --disable-pip-version-check \
    && rm -rf /tmp/dist \
    && (groupadd --system --gid 1000 keel \
        && useradd --system --uid 1000 --gid 1000 --home-dir /var/lib/keel --shell /usr/sbin/nologin keel \
        || { echo 'keel:x:1000:' >> /etc/group \
             && echo 'keel:x:1000:1000::/var/lib/keel:/usr/sbin/nologin' >> /etc/passwd; }) \
    && mkdir -p /var/lib/keel /app \
    && chown 1000:1000 /var/lib/keel && chmod 0700 /var/lib/keel
ENV PATH=/opt/keel/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    KEEL_HOME=/var/lib/keel
# An empty working folder: nothing here shadows the installed packages.
WORKDIR /app
USER 1000:1000
EXPOSE 8000 5555 8025
# The API by default (compose runs the other parts with their own commands).
CMD ["gunicorn", "-c", "python:web.gunicorn_conf", "-b", "0.0.0.0:8000", "web:create_app()"]
