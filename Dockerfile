# The worker / CLI image used by docker-compose.yml (production-like topology).
FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir .
# Derive the int8-compute embedder at build time, not in every container's first start.
ENV MEMSTREAM_CACHE_DIR=/opt/memstream-cache
RUN python -c "from memstream.embedding.quantize import dynamic_model; dynamic_model()"
# Not root: a process that parses strangers' input gets no more than its own files. The keys
# directory exists here, owned by that user, so a named volume mounted on it starts so owned.
RUN useradd --system --uid 10001 --home-dir /var/lib/memstream memstream \
    && mkdir -p /var/lib/memstream/keys && chown -R memstream /var/lib/memstream \
    && chmod -R a+rX /opt/memstream-cache
USER memstream
ENTRYPOINT ["memstream"]
CMD ["worker"]
