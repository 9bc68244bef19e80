#!/bin/sh
set -eu
bin=/usr/lib/postgresql/15/bin
data=/var/lib/postgresql/data
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
chown postgres:postgres "$data"
chmod 700 "$data"
if [ ! -s "$data/PG_VERSION" ]; then
  printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
  chown postgres /tmp/pwfile
  as_postgres "$bin/initdb" -D "$data" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile \
    --encoding=UTF8 --locale=C.UTF-8 \
    --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f /tmp/pwfile
  echo "host all all all scram-sha-256" >> "$data/pg_hba.conf"
  as_postgres "$bin/pg_ctl" -D "$data" -o "-c listen_addresses=''" -w start >/dev/null
  as_postgres "$bin/psql" -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres \
    -c "CREATE DATABASE \"$POSTGRES_DB\"" >/dev/null
  as_postgres "$bin/pg_ctl" -D "$data" -m fast -w stop >/dev/null
fi
exec setpriv --reuid=postgres --regid=postgres --init-groups \
  "$bin/postgres" -D "$data" -c listen_addresses='*'
