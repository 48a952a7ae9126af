# Two images from one file:
#   docker build --target server -t tunecache-server .   the cache server (no torch, no GPU)
#   docker build --target daemon -t tunecache-daemon .   the tuning daemon (CUDA torch, Triton, TVM)
# Both install the same source tree, gathered once in the `source` stage, with different extras.

FROM scratch AS source
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tunecache ./tunecache
COPY tunecache_cli ./tunecache_cli
COPY cache_server ./cache_server
COPY tuner ./tuner
COPY backends ./backends
COPY workloads ./workloads

FROM python:3.11-slim AS server
WORKDIR /app
COPY --from=source /app ./
RUN pip install --no-cache-dir '.[server]'
EXPOSE 8765
ENV TUNECACHE_SERVER_HOST=0.0.0.0
CMD ["tunecache", "serve"]

# The daemon runs on a GPU machine: the PyTorch CUDA image brings torch and Triton.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime AS daemon
WORKDIR /app
COPY --from=source /app ./
RUN pip install --no-cache-dir '.[tuner,tvm,triton]'
CMD ["tunecache", "daemon"]
