#!/usr/bin/env bash
# Set-up command 1: install what is needed, build sidecore, and run the built-in
# example (a record source on one dedicated core feeding an Internet-checksum
# offcode on another through a zero-copy ring) for a few seconds; then, as root,
# the firewall demo (generator → XDP / user-space / nftables firewall → analyser
# on a testbed of network namespaces, HYDRA's Table 8.8).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release -p sidecore --quiet
bin="${CARGO_TARGET_DIR:-target}/release/sidecore"
"$bin" devices
"$bin" check examples/checksum.toml
"$bin" layout examples/checksum.toml
"$bin" up examples/checksum.toml --for "${SIDECORE_DEMO_SECONDS:-5}s" --socket "${TMPDIR:-/tmp}/sidecore-demo.sock"
if [ "$(id -u)" -eq 0 ]; then
  "$bin" demo firewall --seconds "${SIDECORE_DEMO_FW_SECONDS:-1}"
else
  echo "demo.sh: the firewall demo needs root (network namespaces, XDP); skipped" >&2
fi
