# A stand-in for the postgres:16 image where no registry is reachable: Debian's PostgreSQL,
# started as the official image starts (POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB make
# the database on the first start, data in /var/lib/postgresql/data, pg_isready answers).
ARG BASE
FROM ${BASE}
RUN mkdir -p /etc/postgresql-common \
    && echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf \
    && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
       postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown postgres:postgres /var/lib/postgresql/data /var/run/postgresql
COPY postgres-entrypoint.sh /usr/local/bin/entrypoint
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
# As the official image: SIGINT is PostgreSQL's fast shutdown (SIGTERM waits for clients).
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/entrypoint"]
