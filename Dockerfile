# Tessera's image: one image, one `tessera` command; docker-compose.yml picks the subcommand.
#
#   docker build -t tessera:latest .
#
# BASE is any Debian-like image with Python 3.11+ and its venv module: the official
# python:3.11-slim by default, or one built locally where no registry is reachable (Debian
# bookworm's python3 and python3-venv; the tests build such a base with debootstrap).
ARG BASE=python:3.11-slim
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/tessera/bin:$PATH \
    TESSERA_DATA_DIR=/data

# The dependencies first, in a layer of their own: a change to the code alone rebuilds only the
# small layer below. Tessera lives in a virtual environment (Debian's own Python refuses
# packages installed beside its own). An empty README stands in for the real one there, so that
# an edit of the README does not install every dependency again.
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -m venv /opt/tessera \
    && touch README.md \
    && mkdir -p app scheduler billing migrations agent \
    && touch app/__init__.py scheduler/__init__.py billing/__init__.py migrations/__init__.py \
       agent/__init__.py \
    && pip install --no-cache-dir . \
    && pip uninstall -y tessera \
    && rm -rf app scheduler billing migrations agent build *.egg-info README.md

# Every package `tessera` imports. `bench/` does not ship: only `tessera bench` imports it,
# and it says so when it is missing.
COPY app ./app
COPY scheduler ./scheduler
COPY billing ./billing
COPY migrations ./migrations
COPY agent ./agent
COPY examples ./examples
COPY README.md ./
RUN pip install --no-cache-dir --no-deps . \
    && rm -rf build *.egg-info \
    && mkdir -p /data && chown 10001:10001 /data

# An unprivileged user by number (the base need not have `useradd`). A node agent with the
# docker runtime runs as a user that may use the Docker socket it is given (see
# docker-compose.yml).
USER 10001:10001
VOLUME ["/data"]
EXPOSE 8443
# `tessera` is PID 1: it stops cleanly on SIGTERM (`docker stop`) by itself.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tessera"]
CMD ["serve", "--host", "0.0.0.0"]
