# One image for every Keel process; compose picks the command.
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md alembic.ini ./
COPY tasks ./tasks
COPY web ./web
COPY migrations ./migrations
RUN pip install --no-cache-dir -e . && useradd --system --uid 1000 keel
USER keel
ENV KEEL_HOME=/tmp/keel
