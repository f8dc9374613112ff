#!/usr/bin/env bash
# The facade crate `outbox` is assembled from cargo features: check that each feature
# builds on its own, that the default set is the embedded SQLite backend and nothing
# else, and that a backend left off is not compiled at all. CI runs this.
set -euo pipefail
cd "$(dirname "$0")/.."

check() {
    echo "== cargo check -p outbox $*" >&2
    cargo check -p outbox --locked --quiet "$@"
}
check
check --no-default-features
for feature in sqlite postgres postgres-wal mysql sqlserver dynamodb dynamodb-streams nats rabbitmq sqs testkit serde otel; do
    check --no-default-features --features "$feature"
done
check --all-features

# What a plain `outbox = "0.1"` compiles: the core and SQLite, no PostgreSQL driver.
tree=$(cargo tree -p outbox --locked -e normal --prefix none)
grep -q '^outbox-sqlite ' <<<"$tree" || { echo "default features lack outbox-sqlite" >&2; exit 1; }
for absent in outbox-postgres outbox-postgres-wal pgwire-replication sqlx-postgres outbox-mysql sqlx-mysql outbox-sqlserver tiberius outbox-dynamodb aws-sdk-dynamodb outbox-dynamodb-streams aws-sdk-dynamodbstreams outbox-nats async-nats outbox-rabbitmq lapin outbox-sqs aws-sdk-sqs outbox-testkit opentelemetry tracing-opentelemetry; do
    if grep -q "^$absent " <<<"$tree"; then
        echo "default features compile $absent" >&2
        exit 1
    fi
done
# And PostgreSQL alone does not compile SQLite.
tree=$(cargo tree -p outbox --locked -e normal --prefix none --no-default-features --features postgres)
for absent in outbox-sqlite sqlx-sqlite libsqlite3-sys; do
    if grep -q "^$absent " <<<"$tree"; then
        echo "--features postgres compiles $absent" >&2
        exit 1
    fi
done
# And the polling PostgreSQL backend alone does not compile the replication client.
tree=$(cargo tree -p outbox --locked -e normal --prefix none --no-default-features --features postgres)
for absent in outbox-postgres-wal pgwire-replication; do
    if grep -q "^$absent " <<<"$tree"; then
        echo "--features postgres compiles $absent" >&2
        exit 1
    fi
done
# And a publisher alone compiles no database driver and not the other broker's client.
for feature in nats rabbitmq sqs; do
    tree=$(cargo tree -p outbox --locked -e normal --prefix none --no-default-features --features "$feature")
    others=$(for client in async-nats lapin aws-sdk-sqs; do
        case "$feature:$client" in nats:async-nats | rabbitmq:lapin | sqs:aws-sdk-sqs) ;; *) echo "$client" ;; esac
    done)
    for absent in outbox-sqlite outbox-postgres sqlx-core $others; do
        if grep -q "^$absent " <<<"$tree"; then
            echo "--features $feature compiles $absent" >&2
            exit 1
        fi
    done
done
# The log-tailing crate without TLS (its default feature `tls` off) still builds.
echo "== cargo check -p outbox-postgres-wal --no-default-features" >&2
cargo check -p outbox-postgres-wal --locked --quiet --no-default-features
echo "feature checks passed" >&2
