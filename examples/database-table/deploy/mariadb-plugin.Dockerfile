# syntax=docker/dockerfile:1
# The MariaDB plugin's image. From the repository root:
#
#   docker build -f examples/database-table/deploy/mariadb-plugin.Dockerfile \
#     -t ghcr.io/kplug/database-table-mariadb-plugin:0.1.0 .
#
# Same recipe as deploy/Dockerfile (BuildKit cache mounts, binary stripped of
# its debug info, distroless, base images as build arguments).
ARG BUILD_IMAGE=rust:1.89-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${BUILD_IMAGE} AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kplug-example-mariadb-plugin \
 && install -D -m 0755 target/release/mariadb-plugin /out/mariadb-plugin \
 && strip --strip-debug /out/mariadb-plugin

# rustls and pure-Rust dependencies only: glibc and libgcc suffice.
FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="database-table-mariadb-plugin" \
      org.opencontainers.image.description="The kplug walkthrough's DatabaseTable plugin for MariaDB (Rust)" \
      org.opencontainers.image.source="https://github.com/kplug/kplug" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/mariadb-plugin /usr/local/bin/mariadb-plugin
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/mariadb-plugin"]
