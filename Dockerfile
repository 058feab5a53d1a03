# capwatch's image: one `capwatch` console script for the agent (run as root,
# privileged, by the chart) and the readiness shim (run by the chart as a
# non-root user with a read-only root filesystem).
#
#   docker build -t capwatch:0.1.0 .
#   make image     # the same Dockerfile with buildah, no registry (scripts/build_image.py)
#
# Both stages start from an image with python3 on PATH. With a registry that is
# python:3.11-slim; `make image` passes bases made from Debian packages instead
# (BUILD_BASE adds python3-venv, which the slim image has built in).
ARG BUILD_BASE=python:3.11-slim
ARG RUNTIME_BASE=python:3.11-slim

# Build stage: every dependency from the hashed lock, then capwatch itself.
FROM ${BUILD_BASE} AS build

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

RUN python3 -m venv /opt/venv

WORKDIR /src
# requirements/image.txt pins every package with its hashes (make lock); pip
# refuses anything that does not match, and wheels only: no compiler runs.
COPY requirements/image.txt ./requirements/image.txt
RUN /opt/venv/bin/pip install --require-hashes --no-deps --only-binary=:all: \
        -r requirements/image.txt
# Only what `pip install .` needs (see .dockerignore): the package metadata,
# the README it names, and every package (pyproject.toml's packages.find).
COPY pyproject.toml README.md ./
COPY kit ./kit
COPY kube ./kube
COPY agent ./agent
COPY api ./api
COPY server ./server
COPY client ./client
COPY controller ./controller
COPY capwatch ./capwatch
# The lock already holds every dependency and the build backend: nothing else
# is fetched. Then pip and setuptools leave the venv.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation . \
    && /opt/venv/bin/pip uninstall --yes pip setuptools

# Runtime stage: the base's interpreter (the venv's python links to it), the
# venv, and nothing else.
FROM ${RUNTIME_BASE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="capwatch" \
      org.opencontainers.image.description="GPU power-cap agent for Kubernetes nodes" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

# No pip in the image: the slim base brings one (Debian's python3 does not).
RUN if python3 -c "import pip" 2>/dev/null; then \
        python3 -m pip uninstall --yes --root-user-action=ignore pip setuptools wheel; \
    fi

COPY --from=build /opt/venv /opt/venv

# Bytecode was compiled at install time; the root filesystem is read-only at
# run time (both containers), so nothing may be written there. TMPDIR is the
# writable emptyDir the chart mounts at /tmp (the sim backend's scratch files).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp

# Non-root by default (the shim, `capwatch watch`): the chart runs the agent
# container as root explicitly, since NVML power-limit writes need it.
USER 65532:65532

ENTRYPOINT ["capwatch"]
CMD ["--help"]
