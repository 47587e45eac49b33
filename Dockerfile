# runmgr's own image (head, workers) for the cpu, gpu and npu overlays and
# the demo: Python, torch, Ray and runmgr, installed as the README does
# (torch pinned, then `pip install .`). For a Megatron-LM or MindSpeed-LLM job
# runmgr goes into YOUR image instead, next to its torch: k8s/image/Dockerfile.
# k8s/ runs them; README "Running on Kubernetes" shows the whole way.
#
#   CPU (the default base):
#     docker build -t runmgr:0.1.0 .
#   NVIDIA (CUDA runtime base; torch==2.13.0 from PyPI is the CUDA build):
#     docker build --build-arg BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 -t runmgr:0.1.0 .
#   Ascend (a CANN base image matching the hosts' driver, with Python 3.10+;
#   EXTRAS=npu adds torch_npu for the pinned torch):
#     docker build --build-arg BASE=ascendai/cann:8.3.rc1-910b-ubuntu22.04-py3.11 \
#                  --build-arg EXTRAS=npu -t runmgr:0.1.0 .
#   The Ascend driver, npu-smi (/usr/local/sbin) and DCMI come from the host
#   (k8s/overlays/npu mounts them read-only); the CANN toolkit must be in the image.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

# The torch requirement installed first, as the Makefile's TORCH.
ARG TORCH=torch==2.13.0
# The Ray of the image: the RayJob's rayVersion in k8s/ says the same.
ARG RAY_VERSION=2.60.0
# Extras of runmgr's pyproject to add, e.g. npu.
ARG EXTRAS=

# A CUDA base has no Python; KubeRay's probes call wget.
RUN apt-get update \
    && apt-get install -y --no-install-recommends wget ca-certificates \
    && (command -v python3 >/dev/null || apt-get install -y --no-install-recommends python3 python3-venv python3-pip) \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv
RUN python3 -m venv "$VIRTUAL_ENV"
# npu-smi where the Ascend driver installs it (/usr/local/sbin) and hccn_tool
# in the driver's tools: runmgr's health check calls both from the PATH.
ENV PATH=/opt/venv/bin:$PATH:/usr/local/sbin:/usr/local/Ascend/driver/tools \
    PYTHONUNBUFFERED=1 \
    RUNMGR_CONF_DIR=/opt/runmgr/conf

WORKDIR /opt/runmgr
COPY . .
RUN python -m pip install --no-cache-dir --disable-pip-version-check \
        "$TORCH" "ray[default]==$RAY_VERSION" ".${EXTRAS:+[$EXTRAS]}" \
    && runmgr --version
