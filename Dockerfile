# The coordinator service. Point COORDINATOR_DATABASE_URL at Postgres in production; without it
# the embedded SQLite file lives in /data (mount a volume there). Listening beyond loopback needs
# a tokens file (COORDINATOR_AUTH_TOKENS_FILE, mounted) or, knowingly, --insecure.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY coordinator ./coordinator
COPY migrations ./migrations
COPY sdk ./sdk
COPY jobs ./jobs
RUN pip install '.[server]' && useradd --create-home --uid 10001 coordinator \
    && mkdir /data && chown coordinator /data

USER coordinator
WORKDIR /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"
CMD ["coordinator", "serve", "--host", "0.0.0.0", "--port", "8080"]
