#!/usr/bin/env bash
# Set-up command 2: install what is needed and run the whole test suite: unit,
# property and end-to-end tests of every crate (the end-to-end ones drive real
# cores, eBPF, sockets and processes), then the lints and the house rules
# (no module cycles: scripts/check-cycles.py).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
python3 scripts/check-cycles.py   # no module imports a module that imports it back
cargo build --workspace --all-targets --quiet
cargo test --workspace --quiet -- --test-threads=2
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "test.sh: all tests passed"
