#!/usr/bin/env bash
# Starts a SQL Server container for outbox-sqlserver's server-gated suites and prints
# the connection string to use, as a line to eval:
#
#   eval "$(scripts/sqlserver.sh --version 2022 --rcsi on)"
#   cargo test -p outbox-sqlserver --locked
#
# Needs Docker and the image mcr.microsoft.com/mssql/server:<version>-latest. CI for this
# repository does not run it (its machines have no Docker registry to pull the image
# from); .github/workflows/sqlserver.yml runs it where both exist. Idempotent: a
# container of that version already running is reused. `--container NAME` uses a
# container started elsewhere (a CI service container) instead of starting one.
#
#   --version 2019|2022     the server's version (default 2022)
#   --rcsi on|off           READ_COMMITTED_SNAPSHOT of the test database (default on,
#                           as on Azure SQL Database; off is the on-premises default)
#   --port N                the host port (default 14<version's last two digits>)
#   --container NAME        an existing container to prepare
#   --stop                  stop and remove the container this script started
#
# The password is a throwaway for a local container; never reuse it.
set -euo pipefail

version=2022
rcsi=on
port=""
container=""
stop=false
while [ $# -gt 0 ]; do
    case "$1" in
        --version) version="$2"; shift 2 ;;
        --rcsi) rcsi="$2"; shift 2 ;;
        --port) port="$2"; shift 2 ;;
        --container) container="$2"; shift 2 ;;
        --stop) stop=true; shift ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
case "$version" in 2019 | 2022) ;; *) echo "--version must be 2019 or 2022" >&2; exit 2 ;; esac
case "$rcsi" in on | off) ;; *) echo "--rcsi must be on or off" >&2; exit 2 ;; esac
port="${port:-14${version: -2}}"
password='Outbox-Test-Passw0rd'
started="outbox-mssql-$version"

if $stop; then
    docker rm -f "$started" >/dev/null 2>&1 || true
    exit 0
fi

if ! command -v docker >/dev/null 2>&1; then
    echo "scripts/sqlserver.sh needs Docker; the SQL Server suites stay skipped without it" >&2
    exit 1
fi

if [ -z "$container" ]; then
    container="$started"
    if [ -z "$(docker ps -q --filter "name=^${container}$")" ]; then
        docker rm -f "$container" >/dev/null 2>&1 || true
        docker run -d --name "$container" \
            -e ACCEPT_EULA=Y -e MSSQL_PID=Developer -e "MSSQL_SA_PASSWORD=$password" \
            -p "127.0.0.1:$port:1433" "mcr.microsoft.com/mssql/server:$version-latest" >/dev/null
    fi
fi

# sqlcmd moved from mssql-tools to mssql-tools18 (which wants -C for the self-signed
# certificate) during 2019's life: use whichever the image has.
sqlcmd() {
    docker exec "$container" bash -c '
        for tool in /opt/mssql-tools18/bin/sqlcmd /opt/mssql-tools/bin/sqlcmd; do
            if [ -x "$tool" ]; then
                case "$tool" in *18*) exec "$tool" -C "$@" ;; *) exec "$tool" "$@" ;; esac
            fi
        done
        echo "no sqlcmd in the image" >&2; exit 1' sqlcmd -b -S localhost -U sa -P "$password" "$@"
}

deadline=$((SECONDS + 120))
until sqlcmd -Q "SELECT 1" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
        echo "SQL Server in $container did not answer within 120 s" >&2
        docker logs --tail 50 "$container" >&2 || true
        exit 1
    fi
    sleep 2
done

database="outbox_test_rcsi_$rcsi"
setting=$([ "$rcsi" = on ] && echo ON || echo OFF)
sqlcmd -Q "
IF DB_ID('$database') IS NULL CREATE DATABASE [$database];
ALTER DATABASE [$database] SET READ_COMMITTED_SNAPSHOT $setting WITH ROLLBACK IMMEDIATE;
ALTER DATABASE [$database] SET QUERY_STORE = ON;" >/dev/null

echo "export OUTBOX_TEST_MSSQL_URL='server=tcp:127.0.0.1,$port;database=$database;user id=sa;password=$password;TrustServerCertificate=true'"
