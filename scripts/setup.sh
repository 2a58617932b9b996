#!/usr/bin/env bash
# Installs everything sidecore needs on a fresh Debian 12 machine: the Debian
# packages (libclang and cmake for the HiGHS MILP solver, iproute2 for
# network-namespace testbeds, nftables for the host firewall baseline, python3
# for the benchmark scripts; clang, llvm and the libbpf headers to compile the
# kernel PE's eBPF programs in C; etcd-server and etcd-client for the Network
# OS's state shared by Sikker agents, /usr/bin/etcd started by the tests;
# nfs-ganesha with nfs-ganesha-vfs as FileWall's real NFSv3 server, rpcbind
# because ganesha will not start without registering there, and libnfs-utils for
# the nfs-ls/nfs-cat/nfs-cp clients, all started by the FileWall tests;
# nodejs and npm to bundle the dashboard's TypeScript with esbuild, chromium for
# its browser test, prometheus for `promtool check metrics`) and the
# Rust pieces (rustfmt, clippy, the wasm32 target for extensions). Idempotent: a
# second run only checks.
set -euo pipefail

need_pkgs=(clang llvm libclang-dev libbpf-dev linux-libc-dev iproute2 nftables pkg-config cmake g++ make python3 etcd-server etcd-client nfs-ganesha nfs-ganesha-vfs rpcbind libnfs-utils chromium prometheus earlyoom)
# Node may come from elsewhere (nodesource) with its own npm; Debian's are used only when there is none.
# Metachory (issue 16): sqlite3 for its end-to-end test, diffutils for
# `exec --diff`. (`sidecore migrate` has its own migrator: Debian's criu
# 3.17 cannot start on Linux 6.18; crates/metachory/src/migrate says why.)
need_pkgs+=(sqlite3 diffutils)
# TCPServers (issue 14): nginx as the third server of its stream and HTTP benchmarks.
need_pkgs+=(nginx)
command -v node >/dev/null || need_pkgs+=(nodejs)
command -v npm >/dev/null || need_pkgs+=(npm)
missing=()
for p in "${need_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup: cargo not found; install Rust with rustup first (https://rustup.rs)" >&2
  exit 1
fi
if ! command -v rustup >/dev/null; then
  echo "setup: rustup not found; the test suite needs rustfmt, clippy and the wasm32-unknown-unknown target, which this script installs through rustup (https://rustup.rs)" >&2
  exit 1
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt >&2
rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy >&2
rustup target list --installed 2>/dev/null | grep -q '^wasm32-unknown-unknown$' || rustup target add wasm32-unknown-unknown >&2

# The dashboard's build tools (esbuild, typescript, playwright-core without its
# browsers: the tests use Debian's chromium), pinned by package-lock.json.
dash="$(dirname "$0")/../dashboard"
if [ ! -x "$dash/node_modules/.bin/esbuild" ] || [ "$dash/package-lock.json" -nt "$dash/node_modules/.package-lock.json" ]; then
  echo "setup: installing the dashboard's npm packages" >&2
  (cd "$dash" && npm ci --no-audit --no-fund --loglevel=error >&2)
fi
