#!/bin/sh
set -eu
if [ "${1:-}" = redis-server ]; then shift; fi
exec setpriv --reuid=redis --regid=redis --init-groups \
  redis-server --bind 0.0.0.0 --protected-mode no "$@"
