# syntax=docker/dockerfile:1
# kplug-operator's image: the zero-code operator that delegates any custom
# resource to kplug plugins. Build from the repository root:
#
#   docker build -f deploy/operator.Dockerfile -t ghcr.io/kplug/kplug-operator:0.1.0 .
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
    cargo build --release --locked -p kplug-operator \
 && install -D -m 0755 target/release/kplug-operator /out/kplug-operator \
 && strip --strip-debug /out/kplug-operator

FROM ${RUNTIME_IMAGE}
LABEL org.opencontainers.image.title="kplug-operator" \
      org.opencontainers.image.description="The zero-code operator: delegates a custom resource to kplug plugins" \
      org.opencontainers.image.source="https://github.com/kplug/kplug" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/kplug-operator /usr/local/bin/kplug-operator
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kplug-operator"]
CMD ["--help"]
