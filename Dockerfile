# syntax=docker/dockerfile:1
# The spool image: the broker (`spool serve`, the default command) and, with the same
# Python, package and Spark jars, the Spark pipeline: `spool compact` / `spool audit` as
# the driver and the standalone Spark worker whose executors run the job's Python code
# (docker-compose.yml explains why the worker must be this image).
#
#   docker build -t spool .
#   docker run -p 127.0.0.1:9092:9092 -v spool-data:/data spool \
#       spool serve --listen 0.0.0.0:9092 --advertise localhost:9092 --data-dir /data

# bookworm pinned: Spark 4 needs Java 17 or 21, and bookworm's JRE 17 is what CI and
# `make test` use; a newer Debian under the plain tag may not package 17.
FROM python:3.11-slim-bookworm

# PYSPARK_PYTHON: executors start this interpreter for the job's Python functions, the
# same 3.11 as the driver's (PySpark refuses a worker Python of another minor version).
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYSPARK_PYTHON=python3

# A headless JRE for pyspark (the driver's JVM, and the worker's), and Debian's
# PostgreSQL JDBC driver (/usr/share/java/postgresql.jar) for `spool compact` / `spool
# audit --storage postgresql://...`; the man directory is missing in slim images and
# some JRE post-install steps write there.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
        libpostgresql-jdbc-java \
    && rm -rf /var/lib/apt/lists/*

# A non-root user owning the data dir; a fresh named volume mounted at /data copies this
# ownership, so the broker, the pipeline and the worker (same uid) can all write there.
ARG SPOOL_UID=10001
RUN groupadd --system --gid "${SPOOL_UID}" spool \
    && useradd --system --uid "${SPOOL_UID}" --gid spool --create-home --home-dir /home/spool spool \
    && mkdir -p /data /audit /secrets \
    && chown spool:spool /data /audit /secrets \
    && chmod 0700 /secrets

# The package from the source tree (pyproject names README.md as its readme). Only the
# four packages are copied: tests and benchmarks stay out of the image.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY persister ./persister
COPY coordinator ./coordinator
COPY broker ./broker
RUN pip install . && rm -rf /src/build

# The health check speaks Kafka: an ApiVersions round trip through spool's own client.
# An open port alone would pass while the broker is wedged or still replaying its logs.
COPY <<'EOF' /usr/local/bin/spool-healthcheck
#!/usr/local/bin/python3
"""Exit 0 if a Kafka broker at HOST:PORT (default 127.0.0.1:9092) answers ApiVersions."""

import asyncio
import sys

from protocol.client import KafkaClient

API_VERSIONS = 18


async def probe(host: str, port: int) -> int:
    client = await KafkaClient.connect(host, port, "spool-healthcheck")
    try:
        body = {"client_software_name": "spool-healthcheck", "client_software_version": "1"}
        response = await client.request(API_VERSIONS, 3, body, 5)
    finally:
        await client.close()
    return int(response.error_code)


host, _, port = (sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:9092").rpartition(":")
try:
    code = asyncio.run(asyncio.wait_for(probe(host or "127.0.0.1", int(port)), 8))
except Exception as exc:  # refused, timed out, closed: all mean unhealthy
    sys.exit(f"spool-healthcheck: ApiVersions failed: {exc!r}")
sys.exit(f"spool-healthcheck: ApiVersions error code {code}" if code else 0)
EOF
RUN chmod 0755 /usr/local/bin/spool-healthcheck

# The SASL variant of the compose cluster (docker-compose.sasl.yml): a generated admin
# credential, written once to the secrets volume and kept on later starts.
COPY <<'EOF' /usr/local/bin/spool-credentials
#!/usr/local/bin/python3
"""Write DIR/broker.toml (a SASL_PLAINTEXT listener with the PLAIN user `admin`, whose
password is generated here, super user of Kafka's StandardAuthorizer) and
DIR/admin.properties (client properties for `spool ... --command-config` and Kafka's
tools), unless DIR already holds both. DIR is argv[1] (default /secrets); argv[2] the
bootstrap.servers written for the client (default localhost:9093; the broker's command
sets advertised.listeners). The password is never printed: read it from
DIR/admin.properties."""

import json
import os
import secrets
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/secrets")
advertise = sys.argv[2] if len(sys.argv) > 2 else "localhost:9093"
broker, client = root / "broker.toml", root / "admin.properties"
if broker.exists() and client.exists():
    print(f"spool-credentials: keeping the admin credential in {client}")
    sys.exit(0)
password = secrets.token_urlsafe(24)  # URL-safe: no quote or backslash to escape
jaas = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    f'username="admin" password="{password}" user_admin="{password}";'
)
settings = {
    "listeners": "PLAINTEXT://0.0.0.0:9092,SASL_PLAINTEXT://0.0.0.0:9093",
    "sasl.enabled.mechanisms": "PLAIN",
    "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas,
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:admin",
}
os.umask(0o077)
root.mkdir(parents=True, exist_ok=True)
# TOML basic strings take JSON's escapes.
broker.write_text("".join(f"{json.dumps(k)} = {json.dumps(v)}\n" for k, v in settings.items()))
client.write_text(
    f"bootstrap.servers={advertise}\nsecurity.protocol=SASL_PLAINTEXT\n"
    f"sasl.mechanism=PLAIN\nsasl.username=admin\nsasl.password={password}\n"
)
print(f"spool-credentials: generated the admin credential, in {client}")
EOF
RUN chmod 0755 /usr/local/bin/spool-credentials

USER spool
WORKDIR /home/spool
VOLUME ["/data"]
EXPOSE 9092 9093

HEALTHCHECK --interval=10s --timeout=10s --start-period=30s --retries=3 \
    CMD ["spool-healthcheck", "127.0.0.1:9092"]

# SIGTERM (docker stop) is spool's clean shutdown: in-flight requests answered, logs
# flushed, exit 0. Clients outside the container need --advertise (see docker-compose.yml).
STOPSIGNAL SIGTERM
CMD ["spool", "serve", "--listen", "0.0.0.0:9092", "--data-dir", "/data"]
