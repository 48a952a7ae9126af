# The cache server image (the tuning daemon needs a GPU image of its own; see docker-compose.yml).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY tunecache ./tunecache
COPY cache_server ./cache_server
COPY tuner ./tuner
COPY backends ./backends
COPY workloads ./workloads
RUN pip install --no-cache-dir '.[server]'
EXPOSE 8765
ENV TUNECACHE_SERVER_HOST=0.0.0.0
CMD ["tunecache", "serve"]
