// SPDX-License-Identifier: GPL-2.0
//
// An eBPF offcode of a user's own: the BPF object sidecore's kernel loader
// (`loader:kernel`) takes from a manifest's `module = "udp_count.bpf.o"`.
//
// * `udp_count` (XDP): counts IPv4 UDP datagrams arriving on an interface,
//   drops those to the port in `config[0]` (0: none), and reports each one on
//   the `events` ring buffer — which the loader turns into the offcode's
//   output channel of the same name.
// * `egress_count` (tc egress): counts every frame leaving an interface.
//   (aya, the loader, names tc programs' section `classifier`, libbpf's `tc`.)
//
// `counts` holds the counters (0 passed, 1 dropped, 2 egress frames, 3
// events lost to a full ring); `config` is configuration user space writes
// (from the manifest's params or a control message).
//
// Build: clang -O2 -g -target bpf -c udp_count.bpf.c -o udp_count.bpf.o
// (Debian: add -I/usr/include/$(gcc -print-multiarch)).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

enum { PASSED = 0, DROPPED = 1, EGRESS = 2, LOST = 3, COUNTERS = 4 };

// One ring buffer record: 16 bytes.
struct event {
	__u32 saddr;   // network byte order
	__u32 daddr;   // network byte order
	__u16 sport;   // host byte order
	__u16 dport;   // host byte order
	__u32 dropped; // 1 if dropped
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, COUNTERS);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16);
} events SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counts, &which);

	if (c)
		__sync_fetch_and_add(c, 1);
}

SEC("xdp")
int udp_count(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip;
	struct udphdr *udp;
	struct event *e;
	__u32 zero = 0, *blocked;
	int drop;

	if ((void *)(eth + 1) > end || eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_UDP || ip->ihl != 5)
		return XDP_PASS;
	udp = (void *)(ip + 1);
	if ((void *)(udp + 1) > end)
		return XDP_PASS;
	blocked = bpf_map_lookup_elem(&config, &zero);
	drop = blocked && *blocked && *blocked == bpf_ntohs(udp->dest);
	count(drop ? DROPPED : PASSED);
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (e) {
		e->saddr = ip->saddr;
		e->daddr = ip->daddr;
		e->sport = bpf_ntohs(udp->source);
		e->dport = bpf_ntohs(udp->dest);
		e->dropped = drop;
		bpf_ringbuf_submit(e, 0);
	} else {
		count(LOST);
	}
	return drop ? XDP_DROP : XDP_PASS;
}

SEC("classifier")
int egress_count(struct __sk_buff *skb)
{
	count(EGRESS);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "GPL";
