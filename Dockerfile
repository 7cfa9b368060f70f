# syntax=docker/dockerfile:1
#
# message-committer: the gRPC message commit service.
#
#   docker build -t message-committer:0.1.0 \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" .
#
# Two stages. The builder resolves nothing: it installs exactly the hashed
# wheels of requirements.lock (runtime dependencies plus the otel and uvloop
# extras, from `pip-compile --generate-hashes --extra otel --extra uvloop`;
# regenerate it as docs/operating.md says)
# into a pip-less virtualenv at /opt/venv, then adds the project's own wheel
# without dependencies. The runtime stage copies only that virtualenv onto a
# fresh slim image: no compiler, no pip cache, no source tree, no tests.
#
# Release pipelines should pin PYTHON_IMAGE by digest
# (python:3.11-slim-bookworm@sha256:...); both stages must use the same image,
# because the virtualenv's interpreter is a symlink to the base image's python.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src

# Dependencies first, so this layer is rebuilt only when the lock changes.
# --require-hashes: every file is checked against the lock's sha256;
# --only-binary: wheels only, so nothing is compiled and no toolchain is needed.
# `pip --python` installs into the venv with the base image's pip, so the
# final virtualenv carries no pip, setuptools or wheel of its own.
COPY requirements.lock ./
RUN python -m venv --without-pip /opt/venv \
    && pip --python /opt/venv/bin/python install --no-cache-dir \
        --require-hashes --only-binary=:all: --requirement requirements.lock

# The project itself: build its wheel, install it without dependencies (they
# are all in the lock) and without an index (nothing can sneak in). Only the
# wheel build fetches its build backend (setuptools, per pyproject.toml); it
# is not installed into /opt/venv.
COPY pyproject.toml README.md ./
COPY service ./service
COPY backends ./backends
COPY toolkit ./toolkit
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && pip --python /opt/venv/bin/python install --no-cache-dir --no-deps --no-index \
        /wheels/message_committer-*.whl

# ---------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="message-committer" \
      org.opencontainers.image.description="Durable, idempotent commit of chat messages over gRPC (memory, Redis or ScyllaDB backend)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11-slim-bookworm" \
      org.opencontainers.image.documentation="docs/operating.md"

# Listen on all IPv4 interfaces inside the container (the defaults are
# loopback only). IPv6-only clusters set both to [::]:PORT.
# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only in Kubernetes and
# the venv is already byte-compiled by pip.
ENV PATH="/opt/venv/bin:${PATH}" \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MC_GRPC_ADDRESS=0.0.0.0:50051 \
    MC_HTTP_ADDRESS=0.0.0.0:9464

# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --system --gid 10001 committer \
    && useradd --system --uid 10001 --gid committer --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin committer \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/message-committer
# /var/lib/message-committer: where compose keeps the Redis deployment identity
# (a volume of its own, so wiping Redis's volume cannot take it along).

COPY --from=builder /opt/venv /opt/venv

USER 10001:10001
WORKDIR /tmp

# 50051: gRPC (commit API, grpc.health.v1, reflection); 9464: /metrics, /healthz, /readyz.
EXPOSE 50051 9464

# Docker's own health state (used by compose's depends_on: service_healthy):
# /readyz answers 200 only after a real backend probe succeeded. urllib raises
# on 503 or a refused connection, so any failure exits non-zero. No curl needed.
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request as u; port = os.environ.get('MC_HTTP_ADDRESS', ':9464').rpartition(':')[2]; u.urlopen(f'http://127.0.0.1:{port}/readyz', timeout=3)"]

# Exec form: the Python process is PID 1 and receives SIGTERM itself; the
# server drains in-flight RPCs for MC_SHUTDOWN_GRACE, then exits.
STOPSIGNAL SIGTERM
ENTRYPOINT ["message-committer"]
CMD ["serve"]
