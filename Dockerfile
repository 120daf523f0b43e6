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
# A compiler for the record batch's walk in C (sdk/_walk.c), removed once it is built; the image
# refuses to build without it rather than fall back to the slower walk in Python.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install '.[server]' && (cd / && python -c 'import sdk._walk') \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 coordinator \
    && mkdir /data && chown coordinator /data

USER coordinator
WORKDIR /data
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD python -c "import urllib.request, sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=2).status != 200)"
CMD ["coordinator", "serve", "--host", "0.0.0.0", "--port", "8080"]
