# The worker / CLI image used by docker-compose.yml (production-like topology).
FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir .
# Derive the int8-compute embedder at build time, not in every container's first start.
ENV MEMSTREAM_CACHE_DIR=/opt/memstream-cache
RUN python -c "from memstream.embedding.quantize import dynamic_model; dynamic_model()"
ENTRYPOINT ["memstream"]
CMD ["worker"]
