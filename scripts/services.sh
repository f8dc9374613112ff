#!/usr/bin/env bash
# Installs (if missing) and starts every service the test suite needs, then prints the
# environment the tests read. Idempotent and fast when everything already runs.
#
#   eval "$(scripts/services.sh)"      # start services, export their URLs
#
# Everything informational goes to stderr; stdout carries only `export` lines.
set -euo pipefail

log() { echo "services: $*" >&2; }

pg_host=127.0.0.1
pg_port=5432
pg_user=postgres
pg_db=outbox_test

pg_ready() { pg_isready -q -h "$pg_host" -p "$pg_port" 2>/dev/null; }

ensure_postgres() {
    if pg_ready; then
        return
    fi
    if ! command -v pg_ctlcluster >/dev/null 2>&1; then
        log "installing PostgreSQL from Debian packages"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq postgresql postgresql-contrib >&2
    fi
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    log "starting PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true
    for _ in $(seq 1 60); do
        pg_ready && break
        sleep 0.5
    done
    pg_ready || { log "PostgreSQL did not come up on $pg_host:$pg_port"; exit 1; }
}

psql_admin() { psql -q -v ON_ERROR_STOP=1 -h "$pg_host" -p "$pg_port" -U "$pg_user" "$@"; }

ensure_database() {
    if ! psql_admin -d postgres -Atc "select 1 from pg_database where datname = '$pg_db'" | grep -q 1; then
        log "creating database $pg_db"
        psql_admin -d postgres -c "create database $pg_db" >&2
    fi
    # Test schemas (obx_<secs>_<rand>) older than an hour are dropped by the tests.
}

ensure_postgres
ensure_database
log "PostgreSQL ready at $pg_host:$pg_port/$pg_db"
echo "export OUTBOX_PG_URL=postgres://$pg_user@$pg_host:$pg_port/$pg_db"
