# syntax=docker/dockerfile:1
# The walkthrough's throwaway PostgreSQL (NOT for production): Debian's
# postgresql-15, run as uid 65532, a new cluster in an empty data directory
# at every start (postgres-entrypoint.sh). From the repository root:
#
#   docker build -f examples/database-table/deploy/databases/postgres.Dockerfile \
#     -t kplug.local/walkthrough-postgres:15 .
#
# hack/images.sh builds it FROM its own localhost/kplug-base/debian (no
# registry there), passed as DEBIAN_IMAGE.
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE}
# No "main" cluster from the package's postinst: the entrypoint makes its own.
RUN mkdir -p /etc/postgresql-common/createcluster.d \
 && echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.d/no-main-cluster.conf \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql-15 \
 && rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/apt/*.bin \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home --shell /usr/sbin/nologin nonroot \
 && install -d -o 65532 -g 65532 -m 0775 /var/run/postgresql /var/lib/postgresql/data
COPY --chmod=0755 examples/database-table/deploy/databases/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data/pgdata \
    LANG=C.UTF-8
USER 65532:65532
EXPOSE 5432
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
