# syntax=docker/dockerfile:1
# The walkthrough's throwaway MariaDB (NOT for production): Debian's
# mariadb-server (10.11), run as uid 65532, a new data directory at every
# start (mariadb-entrypoint.sh). From the repository root:
#
#   docker build -f examples/database-table/deploy/databases/mariadb.Dockerfile \
#     -t kplug.local/walkthrough-mariadb:10.11 .
#
# hack/images.sh builds it FROM its own localhost/kplug-base/debian (no
# registry there), passed as DEBIAN_IMAGE.
ARG DEBIAN_IMAGE=debian:bookworm-slim

FROM ${DEBIAN_IMAGE}
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mariadb-server \
 && rm -rf /var/lib/apt/lists/* /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/apt/*.bin \
    /var/lib/mysql \
 && groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --home-dir /home/nonroot --create-home --shell /usr/sbin/nologin nonroot \
 && install -d -o 65532 -g 65532 -m 0775 /run/mysqld /var/lib/mysql
COPY --chmod=0755 examples/database-table/deploy/databases/mariadb-entrypoint.sh /usr/local/bin/mariadb-entrypoint.sh
ENV LANG=C.UTF-8
USER 65532:65532
EXPOSE 3306
ENTRYPOINT ["/usr/local/bin/mariadb-entrypoint.sh"]
