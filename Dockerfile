# preflight launcher leg image: the reviewed trainer files, runtime/, and their
# locked Python dependencies. Built by `launcher image build`, which prepares the
# context (app/ = the reviewed files, runtime/, docker/*.lock, wheelhouse/ =
# wheels downloaded on the host from the lock) and labels the image with the
# sha256 of every file baked in.
#
# CPU (default): Debian bookworm, Python 3.11, torch CPU from docker/cpu.lock.
# GPU rungs:     --base pytorch/pytorch:2.7.1-cuda12.6-cudnn9-runtime@sha256:2b59b1b91885677814f78be1f8df48a25d5dc952eb6580eaecfefca510f9afd3
#                (a CUDA torch on a digest-pinned base; LOCK=docker/gpu.lock adds the rest).
# Both bases have apt, which SkyPilot's docker runtime needs.
ARG BASE_IMAGE=python:3.11-slim-bookworm@sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

# --- stage 1: a venv installed from the wheelhouse, hashes required ---------
FROM ${BASE_IMAGE} AS deps
ARG LOCK=docker/cpu.lock
COPY wheelhouse/ /wheels/
COPY ${LOCK} /tmp/requirements.lock
# --system-site-packages: on the GPU base, torch comes from the base image.
RUN python3 -m venv --system-site-packages /opt/venv \
 && /opt/venv/bin/python -m pip install --no-cache-dir --no-index --find-links /wheels \
      --require-hashes --no-deps -r /tmp/requirements.lock

# --- stage 2: the leg image (no wheelhouse left in any layer) --------------
FROM ${BASE_IMAGE}
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/opt/preflight \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_DISABLE_XET=1
# What SkyPilot's docker runtime apt-installs on every fresh node before the job
# starts (billed minutes): baked in for images meant for clouds (`launcher image
# build --gpu`, or `--sky`); empty for local docker legs. SkyPilot still runs its
# apt-get, which then finds everything installed.
ARG SKY_NODE_PACKAGES=""
# hadolint ignore=DL3008,SC2086
RUN if [ -n "$SKY_NODE_PACKAGES" ]; then \
      apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        $SKY_NODE_PACKAGES && rm -rf /var/lib/apt/lists/*; \
    fi
COPY --from=deps /opt/venv /opt/venv
COPY runtime/ /opt/preflight/runtime/
# The reviewed files: a leg runs from here, and its writes (checkpoints, data)
# land in the container's own layer, which is new for every container.
WORKDIR /app
COPY app/ /app/
CMD ["python", "train.py"]
