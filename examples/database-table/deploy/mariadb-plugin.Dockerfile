# syntax=docker/dockerfile:1
# The MariaDB plugin's image. From the repository root:
#
#   docker build -f examples/database-table/deploy/mariadb-plugin.Dockerfile \
#     -t ghcr.io/kplug/database-table-mariadb-plugin:0.1.0 .
FROM rust:1.89-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kplug-example-mariadb-plugin \
 && install -D -m 0755 target/release/mariadb-plugin /out/mariadb-plugin

# rustls and pure-Rust dependencies only: glibc and libgcc suffice.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/mariadb-plugin /usr/local/bin/mariadb-plugin
USER 65532:65532
EXPOSE 50051
ENTRYPOINT ["/usr/local/bin/mariadb-plugin"]
