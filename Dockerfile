# CPU image: kserve-v2 on ONNX Runtime's CPU execution provider (docs/deploy.md).
#   docker build -t kserve-v2:cpu .                             # the server; models come from /mnt/models
#   docker build -t kserve-v2:cpu-examples --target examples .  # plus examples/model_repository
#   docker build --build-arg ONNXRUNTIME=onnxruntime-openvino -t kserve-v2:openvino .  # plus OpenVINO
# Build context: the repository root (.dockerignore keeps environments and caches out).
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# Build stage: a virtual environment with the server and its run-time dependencies (wheels only).
FROM ${PYTHON_IMAGE} AS build
# the ONNX Runtime package: onnxruntime, or onnxruntime-openvino for `cpu_execution_accelerator: openvino`
ARG ONNXRUNTIME=onnxruntime
# the optional dependency groups installed too: the libraries that read s3://, gs:// and as:// model repositories
# (pinned by constraints.txt); --build-arg EXTRAS= leaves them out
ARG EXTRAS="s3 gcs azure"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml constraints.txt README.md ./
COPY deploy/docker/requirements.py deploy/docker/
COPY kserve_v2 kserve_v2
COPY transcoding transcoding
COPY adapters adapters
RUN python -m venv /opt/kserve-v2 \
 && python deploy/docker/requirements.py --onnxruntime "${ONNXRUNTIME}" --extras "${EXTRAS}" > requirements.txt \
 && /opt/kserve-v2/bin/pip install --only-binary=:all: -c constraints.txt -r requirements.txt \
 && /opt/kserve-v2/bin/pip install --no-deps . \
 && /opt/kserve-v2/bin/pip uninstall -y pip

# Run-time stage: the environment only; no compiler, no pip. uid 1000 as KServe's Triton runtime.
FROM ${PYTHON_IMAGE} AS base
RUN useradd --uid 1000 --user-group --create-home --home-dir /home/kserve kserve
COPY --from=build /opt/kserve-v2 /opt/kserve-v2
# XDG_CACHE_HOME: caches in the writable /tmp, as a read-only root file system allows (ONNX Runtime
# otherwise writes a non-JSON warning that it cannot keep its telemetry id under ~/.cache).
ENV PATH=/opt/kserve-v2/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    KSERVE_V2_MODEL_REPOSITORY=/mnt/models \
    KSERVE_V2_HTTP_PORT=8080 \
    KSERVE_V2_GRPC_PORT=8081 \
    KSERVE_V2_METRICS_PORT=8002 \
    XDG_CACHE_HOME=/tmp/.cache
USER 1000
WORKDIR /home/kserve
# 8080 REST (KServe's HTTP port), 8081 gRPC (KServe's gRPC port), 8002 Prometheus metrics.
# No HEALTHCHECK: Kubernetes probes do it (gRPC grpc.health.v1, or HTTP /v2/health/*).
EXPOSE 8080 8081 8002
# `kserve-v2 serve`; Triton's arguments (`tritonserver --model-store=...`) work as well.
ENTRYPOINT ["kserve-v2"]
CMD ["serve"]

# Triton's example models baked in, for trying the image without a volume.
FROM base AS examples
COPY --chown=1000:1000 examples/model_repository /models
ENV KSERVE_V2_MODEL_REPOSITORY=/models

# The default target (last stage): the server without models.
FROM base AS runtime
