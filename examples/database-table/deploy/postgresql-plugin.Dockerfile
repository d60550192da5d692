# syntax=docker/dockerfile:1
# The PostgreSQL plugin's image. From the repository root:
#
#   docker build -f examples/database-table/deploy/postgresql-plugin.Dockerfile \
#     -t ghcr.io/kplug/database-table-postgresql-plugin:0.1.0 .
#
# The base image is a build argument (both stages: the virtualenv is tied to
# its Python); hack/images.sh passes one it makes itself.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN python -m venv /opt/venv
COPY sdk/python /src/sdk/python
COPY examples/database-table/postgresql-plugin /src/postgresql-plugin
# psycopg[binary] brings its own libpq: no system packages needed.
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/venv/bin/pip install "/src/sdk/python[identity]" /src/postgresql-plugin

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="database-table-postgresql-plugin" \
      org.opencontainers.image.description="The kplug walkthrough's DatabaseTable plugin for PostgreSQL (Python)" \
      org.opencontainers.image.source="https://github.com/kplug/kplug" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["database-table-postgresql-plugin"]
