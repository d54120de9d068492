# The waystation image: worker (default command), HTTP API, CLI.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY waystation waystation
RUN pip install --no-cache-dir .
# Containers talk to a real Temporal service. /data is the worker's own (its SQLite storage
# and workspace unless WAYSTATION_DATABASE_URL and WAYSTATION_WORKSPACE point elsewhere).
ENV WAYSTATION_EMBEDDED_SERVER=false \
    WAYSTATION_DATA_DIR=/data \
    PYTHONUNBUFFERED=1
VOLUME /data
CMD ["ws", "worker"]
