# syntax=docker/dockerfile:1
#
# gpulse container image.
#
#   docker build -t gpulse .
#   docker run --rm --runtime=nvidia --gpus all --pid=host \
#     -v /proc:/host/proc:ro -e HOST_PROC=/host/proc \
#     -e OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318 gpulse
#
# The image carries only the gpulse binary on a distroless base: no shell, no package manager,
# nothing written at run time, so it runs with a read-only root filesystem as uid 65532.
# libnvidia-ml.so.1 is NOT in the image: the NVIDIA container runtime mounts the host driver's
# copy when the container asks for the "utility" capability (NVIDIA_DRIVER_CAPABILITIES below),
# so the image never pins a driver version.
#
# Build and runtime stages share one Debian release (bookworm = debian12): the binary links
# against the build stage's glibc and must find the same or a newer one at run time.
# tests/deploy/test_dockerfile.py checks that, and that the cargo command below is the one CI runs.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot
# Where the binary comes from: "build" compiles it in the stage below; "prebuilt" takes the binary
# scripts/image staged at target/image/gpulse, built outside by the same cargo command (docs/deploy.md
# says why: compiling from scratch inside the engine costs minutes of CI on every run).
ARG BINARY_STAGE=build

# Only the final stage is labelled; hadolint cannot see that BINARY_STAGE names the next two.
# hadolint ignore=DL3049
FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# The cache mounts keep the crate registry and target/ between builds on one builder; the binary
# is copied out of target/ inside the same RUN because a cache mount is gone after it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p gpulse \
    && install -D -m 0755 target/release/gpulse /out/gpulse

# hadolint ignore=DL3049
FROM scratch AS prebuilt
COPY target/image/gpulse /out/gpulse

# A stage chosen by name: builders skip the stage nobody uses, so a registry build never needs
# target/image and a prebuilt one never compiles.
# hadolint ignore=DL3049
FROM ${BINARY_STAGE} AS binary

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpulse" \
      org.opencontainers.image.description="NVIDIA GPU metrics as OpenTelemetry (OTLP), each GPU process under its own resource" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot" \
      org.opencontainers.image.documentation="docs/deploy.md"
COPY --from=binary /out/gpulse /usr/local/bin/gpulse
# "utility" is the NVML-only capability: it brings libnvidia-ml.so.1 and nvidia-smi, not the CUDA
# user-space libraries (compute) or the display stack, so gpulse gets no more of the driver than it reads.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Numeric, so Kubernetes can verify runAsNonRoot without looking the name up in /etc/passwd.
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpulse", "run"]
