#!/usr/bin/env bash
# Set-up command 2: install what is needed and run the whole test suite: unit,
# property and end-to-end tests of every crate (the end-to-end ones drive real
# cores, eBPF, sockets and processes), then the lints and the house rules
# (no module cycles: scripts/check-cycles.py).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
python3 scripts/check-cycles.py   # no module imports a module that imports it back
# The target directory is shared between clones (.ci/run), and env!() bakes the
# clone's path into a test binary that a later clone may reuse: tests read
# CARGO_MANIFEST_DIR at run time instead.
if grep -rn 'env!("CARGO_MANIFEST_DIR")' crates/*/tests crates/*/benches 2>/dev/null; then
    echo 'test.sh: use std::env::var("CARGO_MANIFEST_DIR") in tests, not env!()' >&2
    exit 1
fi
(cd dashboard && npx --no-install tsc --noEmit)   # the dashboard's TypeScript type-checks
cargo build --workspace --all-targets --quiet
cargo test --workspace --quiet -- --test-threads=2
# The ring's loom model check (crates/channel/tests/loom.rs): about 20 s to run
# and under 2 minutes to build cold. `--cfg loom` rebuilds every dependency, so
# it gets its own target directory instead of invalidating the shared one.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test -p sidecore-channel --test loom --release --quiet
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "test.sh: all tests passed"
