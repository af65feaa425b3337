# The worker / CLI image used by docker-compose.yml (production-like topology).
FROM python:3.11-slim
WORKDIR /app
COPY . .
RUN pip install --no-cache-dir .
ENTRYPOINT ["memstream"]
CMD ["worker"]
