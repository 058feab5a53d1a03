# capwatch's image: one `capwatch` console script for the agent (run as root,
# privileged, by the chart) and the readiness shim (run by the chart as a
# non-root user with a read-only root filesystem).
#
#   docker build -t capwatch:0.1.0 .

# Build stage: install the project and its dependencies into a venv.
FROM python:3.11-slim AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN python -m venv /opt/venv

WORKDIR /src
# Only what `pip install .` needs (see .dockerignore): the package metadata,
# the README it names, and every package (pyproject.toml's packages.find).
COPY pyproject.toml README.md ./
COPY kit ./kit
COPY agent ./agent
COPY api ./api
COPY server ./server
COPY client ./client
COPY controller ./controller
COPY capwatch ./capwatch
RUN /opt/venv/bin/pip install . \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

# Runtime stage: the same base image (the venv's interpreter is its python),
# plus the venv and nothing else.
FROM python:3.11-slim

LABEL org.opencontainers.image.title="capwatch" \
      org.opencontainers.image.description="GPU power-cap agent for Kubernetes nodes" \
      org.opencontainers.image.licenses="Apache-2.0"

COPY --from=build /opt/venv /opt/venv

# Bytecode was compiled at install time; a read-only root filesystem (the
# shim's) must not be written to at run time.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

# Root by default: the agent writes GPU power limits through NVML and reads
# every process's /proc/<pid>/cgroup. The chart runs the shim container as a
# non-root user of its own.
# hadolint ignore=DL3002
USER 0

ENTRYPOINT ["capwatch"]
CMD ["--help"]
