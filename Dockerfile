# One image for every Keel process; compose picks the command.
# Keel is installed from its sources as a regular (non-editable) package, so the
# image runs what a wheel ships, migrations included; the sources are then
# removed and the working folder is empty (`celery -A tasks` imports from the
# working folder first).
FROM python:3.11-slim
COPY setup.cfg pyproject.toml README.md /src/
COPY tasks /src/tasks
COPY web /src/web
COPY migrations /src/migrations
RUN pip install --no-cache-dir /src && rm -rf /src && useradd --system --uid 1000 keel
WORKDIR /app
USER keel
ENV KEEL_HOME=/tmp/keel
# The API by default (compose runs the other parts with their own commands).
EXPOSE 8000
CMD ["gunicorn", "-c", "python:web.gunicorn_conf", "-b", "0.0.0.0:8000", "web:create_app()"]
