# The quota-gate image: `serve` by default, `consume ...` or any other
# subcommand by argument (docs/self-hosting.md).
#
#   podman build --format docker -t quota-gate .    # or: docker build -t quota-gate .
#
# `--format docker` keeps the HEALTHCHECK (podman's default OCI format has
# no field for it). With a `vendor/` directory from `cargo vendor --locked`
# in the context, the build reads crates from there and needs no network.

FROM rust:1.95-slim-bookworm AS build
# The cargo profile: `release` for what runs; scripts/container-check builds
# with `--build-arg PROFILE=dev`, which checks the same steps without LTO's wait.
ARG PROFILE=release
WORKDIR /src
COPY . .
# The cache mounts keep the registry and the compiled dependencies between
# builds, so a change to the gate's own code rebuilds only the gate.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    set -eu; \
    if [ -d vendor ]; then \
      set -- --offline \
        --config 'source.crates-io.replace-with="vendored-sources"' \
        --config 'source.vendored-sources.directory="vendor"'; \
    fi; \
    cargo build --profile "$PROFILE" --locked --bin quota-gate "$@"; \
    dir=$PROFILE; [ "$dir" = dev ] && dir=debug; \
    install -D "target/$dir/quota-gate" /out/quota-gate

FROM debian:bookworm-slim
# The binary links only glibc and libgcc; TLS (rediss://, SQS) needs the CA
# bundle, taken from the build stage so this stage installs no package.
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/quota-gate /usr/local/bin/quota-gate
RUN useradd --uid 10001 --user-group --no-create-home --no-log-init \
      --home-dir /nonexistent --shell /usr/sbin/nologin quota-gate
# Numeric, so a runtime that checks "not root" (Kubernetes runAsNonRoot)
# can tell without reading /etc/passwd.
USER 10001:10001
ENV QUOTA_LISTEN=0.0.0.0:8080
EXPOSE 8080
# `serve` and `consume` drain on SIGTERM within QUOTA_DRAIN_TIMEOUT, below
# the 10 s a runtime waits before it kills.
STOPSIGNAL SIGTERM
# The binary probes itself: the image needs no curl or shell for this.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["quota-gate", "probe", "http://127.0.0.1:8080/readyz"]
ENTRYPOINT ["quota-gate"]
CMD ["serve"]
