#!/usr/bin/env bash
# The project's test command: starts the services the tests need, then runs every
# test in the workspace against them. Set OUTBOX_REQUIRE_INTEGRATION=1 to make a
# missing service fail the run instead of skipping its tests (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
cargo test --workspace --locked "$@"
# The examples that are checks as well as demos: each exits non-zero if a message is
# lost or applied twice.
cargo run --quiet --locked -p example-quickstart
if [ -n "${OUTBOX_PG_URL:-}" ]; then
    cargo run --quiet --locked -p example-idempotent-consumer
    cargo run --quiet --locked -p example-readme-usage
fi
