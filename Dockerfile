# Tessera's image: one image, one `tessera` command; docker-compose.yml picks the subcommand.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TESSERA_DATA_DIR=/data

WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY scheduler ./scheduler
COPY billing ./billing
COPY migrations ./migrations
COPY bench ./bench
COPY examples ./examples
RUN pip install --no-cache-dir . && useradd --create-home --uid 10001 tessera \
    && mkdir -p /data && chown tessera /data

USER tessera
VOLUME ["/data"]
EXPOSE 8443
ENTRYPOINT ["tessera"]
CMD ["serve", "--host", "0.0.0.0"]
