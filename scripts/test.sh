#!/usr/bin/env bash
# The project's test command: starts the services the tests need, then runs every
# test in the workspace against them. Set OUTBOX_REQUIRE_INTEGRATION=1 to make a
# missing service fail the run instead of skipping its tests (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
eval "$(scripts/services.sh)"
cargo test --workspace --locked "$@"
