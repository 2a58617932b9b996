#!/usr/bin/env bash
# Throughput of the built-in pipeline (record source → Internet checksum) with
# the checksum on a peer node, against the same pipeline on two local cores,
# measured side by side in one run. The peer is a real `sidecore daemon`: once
# on loopback, once in its own network namespace behind a veth pair.
#
#   scripts/bench-remote.sh [SECONDS] [RECORD_SIZE]
set -euo pipefail
secs=${1:-5}
size=${2:-64}
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
bin=$target/release/sidecore
# Always (re)build: a no-op when up to date, and never a stale binary.
(cd "$root" && cargo build --release -p sidecore --quiet)
tmp=$(mktemp -d)
cleanup() {
  [ -n "${peer_pid:-}" ] && kill "$peer_pid" 2>/dev/null || true
  [ -n "${ns_pid:-}" ] && kill "$ns_pid" 2>/dev/null || true
  ip link del sc-b0 2>/dev/null || true
  ip netns del sc-bench 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

slot=$(( (size + 16 + 15) / 16 * 16 ))   # the ring's slots carry a 16-byte header
for m in checksum remote; do
  sed -e "s/record_size = 64/record_size = $size/" -e "s/slot_size = 128/slot_size = $slot/" \
    "$root/examples/$m.toml" > "$tmp/$m.toml"
done
mv "$tmp/checksum.toml" "$tmp/local.toml"

rate() { # json -> checksum records per second
  python3 -c 'import json,sys; v=json.load(sys.stdin); o=[o for o in v["status"][0]["offcodes"] if o["name"]=="checksum"][0]; print("%.0f %s %s" % (o["metrics"]["records"]/v["seconds"], o["metrics"]["sequence_gaps"], o["pe"]))'
}

run_local() { "$bin" up "$tmp/local.toml" --for "${secs}s" --json --quiet --socket "$tmp/o.sock" | rate; }
run_remote() { # nodes-file
  "$bin" up "$tmp/remote.toml" --for "${secs}s" --json --quiet --socket "$tmp/o.sock" --nodes "$1" | rate
}

# Peer on loopback.
"$bin" daemon --listen 127.0.0.1:7431 --name peer --socket "$tmp/p.sock" 2>"$tmp/p.log" &
peer_pid=$!
printf '[[node]]\nname = "peer"\naddr = "127.0.0.1:7431"\n' > "$tmp/lo.toml"
# Peer in a network namespace.
ip netns add sc-bench
ip link add sc-b0 type veth peer name sc-b1
ip link set sc-b1 netns sc-bench
ip addr add 10.232.0.1/24 dev sc-b0 && ip link set sc-b0 up
ip netns exec sc-bench ip addr add 10.232.0.2/24 dev sc-b1
ip netns exec sc-bench ip link set sc-b1 up
ip netns exec sc-bench ip link set lo up
ip netns exec sc-bench "$bin" daemon --listen 10.232.0.2:7431 --name peer --socket "$tmp/n.sock" 2>"$tmp/n.log" &
ns_pid=$!
printf '[[node]]\nname = "peer"\naddr = "10.232.0.2:7431"\n' > "$tmp/ns.toml"
sleep 1

echo "record size $size B, $secs s per run; checksum records/s, sequence gaps, where"
for round in 1 2; do
  l=$(run_local); r=$(run_remote "$tmp/lo.toml"); n=$(run_remote "$tmp/ns.toml")
  python3 - "$round" "$l" "$r" "$n" <<'PY'
import sys
rnd, l, r, n = sys.argv[1], *[a.split() for a in sys.argv[2:]]
lr, rr, nr = float(l[0]), float(r[0]), float(n[0])
print(f"round {rnd}: local ring {lr/1e6:.2f} M/s (gaps {l[1]}, {l[2]}) | "
      f"peer on loopback {rr/1e6:.2f} M/s (gaps {r[1]}, {r[2]}) = {rr/lr:.3f}x | "
      f"peer in netns {nr/1e6:.2f} M/s (gaps {n[1]}, {n[2]}) = {nr/lr:.3f}x")
PY
done
