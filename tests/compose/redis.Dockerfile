# A stand-in for the redis:7 image where no registry is reachable: Debian's Redis, listening on
# every address without protected mode (as the official image), the command's arguments passed on.
ARG BASE
FROM ${BASE}
RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
       redis-server \
    && rm -rf /var/lib/apt/lists/*
COPY redis-entrypoint.sh /usr/local/bin/entrypoint
WORKDIR /var/lib/redis
EXPOSE 6379
ENTRYPOINT ["/usr/local/bin/entrypoint"]
CMD ["redis-server"]
