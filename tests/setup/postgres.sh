#!/usr/bin/env bash
# The tests' Postgres: Debian's `postgresql`, one cluster listening on 127.0.0.1:5432, where
# postgresql://postgres@127.0.0.1:5432/test works without a password (trust on loopback only:
# a test server, reachable from this machine alone). Idempotent: a second run finds the package
# installed and the cluster running, and only checks. Fails loudly when it cannot make the URL work.
set -euo pipefail

fail() { echo "FAIL (tests/setup/postgres.sh): $*" >&2; exit 1; }

if ! command -v pg_ctlcluster >/dev/null || [ -z "$(ls /usr/lib/postgresql 2>/dev/null)" ]; then
    [ "$(id -u)" = 0 ] || fail "Postgres is not installed and only root can install it (apt-get install postgresql)"
    apt-get install -y -qq postgresql >/dev/null || fail "apt-get install postgresql failed (run apt-get update first)"
fi

version=$(ls /usr/lib/postgresql | sort -V | tail -1)
[ -n "$version" ] || fail "no Postgres server under /usr/lib/postgresql"
if ! pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {found=1} END {exit !found}'; then
    pg_createcluster "$version" main >/dev/null || fail "pg_createcluster $version main failed"
fi

conf=/etc/postgresql/$version/main
# What the tests need of the server; conf.d is read last, so this wins over postgresql.conf.
cat > "$conf/conf.d/coordinator-tests.conf" <<CONF
listen_addresses = '127.0.0.1'
port = 5432
# Each test module's services and pools, and the fault workload's processes, at once.
max_connections = 300
# Loopback only: no TLS handshake on each of the tests' many connections.
ssl = off
CONF
# Trust on loopback, first so it wins over the package's scram lines. Written once.
marker="# coordinator tests: trust on loopback"
if ! grep -qF "$marker" "$conf/pg_hba.conf"; then
    { echo "$marker"
      echo "host    all             all             127.0.0.1/32            trust"
      echo "host    replication     all             127.0.0.1/32            trust"
      cat "$conf/pg_hba.conf"; } > "$conf/pg_hba.conf.new"
    chown postgres:postgres "$conf/pg_hba.conf.new"
    mv "$conf/pg_hba.conf.new" "$conf/pg_hba.conf"
fi

status=$(pg_lsclusters -h | awk -v v="$version" '$1 == v && $2 == "main" {print $4}')
if [ "$status" = online ]; then
    # Running: pick up a changed pg_hba.conf (a changed max_connections needs a restart).
    pg_ctlcluster "$version" main reload
    if [ "$(psql -h 127.0.0.1 -U postgres -Atc 'show max_connections' 2>/dev/null)" != 300 ] \
        || [ "$(psql -h 127.0.0.1 -U postgres -Atc 'show ssl' 2>/dev/null)" != off ]; then
        pg_ctlcluster --skip-systemctl-redirect "$version" main restart
    fi
else
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || fail "the cluster $version/main did not start"
fi
for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
pg_isready -q -h 127.0.0.1 -p 5432 || fail "Postgres does not answer on 127.0.0.1:5432"

if [ "$(psql -h 127.0.0.1 -U postgres -Atc "select 1 from pg_database where datname = 'test'")" != 1 ]; then
    createdb -h 127.0.0.1 -U postgres test || fail "createdb test failed"
fi
psql -q -h 127.0.0.1 -U postgres -d test -c 'select 1' >/dev/null \
    || fail "postgresql://postgres@127.0.0.1:5432/test does not work"
echo "Postgres $version: postgresql://postgres@127.0.0.1:5432/test"
