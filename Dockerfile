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
# The API by default (compose runs the other parts with their own commands).
EXPOSE 8000
CMD ["gunicorn", "-c", "python:web.gunicorn_conf", "-b", "0.0.0.0:8000", "web:create_app()"]
