// SPDX-License-Identifier: GPL-2.0
//
// SCIRON on the kernel PE: an XDP program that classifies each IPv4 packet
// against the firewall's tuple-space tables (see sidecore-firewall's
// classify.rs) and drops or passes it. First match wins: the lowest rule
// index found over all shapes decides; no match denies. Non-IPv4 frames pass
// (ARP and IPv6 neighbour discovery must keep working).
//
// Tables come in two generations; user space fills the idle one and flips
// `fw_config.gen`, so a rule update never leaves a moment with no rules.
// Log rules report matching packets on the `fw_log` ring buffer.
//
// Struct layouts are mirrored in crates/kernel/src/firewall.rs; keep the two
// in step (the loader checks the sizes against the BTF of this object).

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define FW_MAX_SHAPES 64
#define FW_MAX_ENTRIES (1 << 20)
#define FW_LOG_BYTES (1 << 20)

#define FW_ACCEPT 1

enum fw_stat {
	FW_ACCEPTED = 0,
	FW_DENIED = 1,
	FW_DEFAULT_DENIED = 2,
	FW_NOT_IPV4 = 3,
	FW_LOG_LOST = 4,
	FW_MALFORMED = 5,
	FW_STATS = 6,
};

struct fw_key {
	__u32 src;
	__u32 dst;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 shape;
	__u8 gen;
	__u8 pad;
};

struct fw_val {
	__u32 rule;
	__u8 action;
	__u8 log;
	__u16 pad;
};

struct fw_shape {
	__u32 src_mask;
	__u32 dst_mask;
	__u16 sport_mask;
	__u16 dport_mask;
	__u8 proto_mask;
	__u8 pad[3];
};

struct fw_config {
	__u32 gen;
	__u32 shapes[2];
};

struct fw_event {
	__u32 rule;
	__u32 src;
	__u32 dst;
	__u16 sport;
	__u16 dport;
	__u8 proto;
	__u8 action;
	__u16 len;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, FW_MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fw_key);
	__type(value, struct fw_val);
} fw_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2 * FW_MAX_SHAPES);
	__type(key, __u32);
	__type(value, struct fw_shape);
} fw_shapes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct fw_config);
} fw_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FW_STATS);
	__type(key, __u32);
	__type(value, __u64);
} fw_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, FW_LOG_BYTES);
} fw_log SEC(".maps");

static __always_inline void count(__u32 stat)
{
	__u64 *c = bpf_map_lookup_elem(&fw_stats, &stat);
	if (c)
		*c += 1;
}

struct fw_packet {
	__u32 src;
	__u32 dst;
	__u16 sport;
	__u16 dport;
	__u8 proto;
};

/* Reads the 5-tuple; -1 for a truncated or malformed IPv4 packet. */
static __always_inline int parse(struct xdp_md *ctx, struct fw_packet *p)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return -1;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return 1;
	struct iphdr *ip = (void *)(eth + 1);
	if ((void *)(ip + 1) > end)
		return -1;
	__u32 ihl = ip->ihl * 4;
	if (ihl < sizeof(*ip))
		return -1;
	p->src = bpf_ntohl(ip->saddr);
	p->dst = bpf_ntohl(ip->daddr);
	p->proto = ip->protocol;
	p->sport = 0;
	p->dport = 0;
	/* Ports for TCP and UDP, in the first fragment only. */
	if ((ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) &&
	    !(ip->frag_off & bpf_htons(0x1fff))) {
		__u16 *ports = (void *)ip + ihl;
		if ((void *)(ports + 2) > end)
			return -1;
		p->sport = bpf_ntohs(ports[0]);
		p->dport = bpf_ntohs(ports[1]);
	}
	return 0;
}

SEC("xdp")
int sidecore_fw(struct xdp_md *ctx)
{
	struct fw_packet p;
	int r = parse(ctx, &p);
	if (r > 0) {
		count(FW_NOT_IPV4);
		return XDP_PASS;
	}
	if (r < 0) {
		count(FW_MALFORMED);
		return XDP_DROP;
	}
	__u32 zero = 0;
	struct fw_config *cfg = bpf_map_lookup_elem(&fw_config, &zero);
	if (!cfg) {
		count(FW_DEFAULT_DENIED);
		return XDP_DROP;
	}
	__u32 gen = cfg->gen & 1;
	__u32 n = cfg->shapes[gen];
	__u32 best = 0xffffffff;
	__u8 action = 0, log = 0;
	for (__u32 i = 0; i < FW_MAX_SHAPES; i++) {
		if (i >= n)
			break;
		__u32 si = gen * FW_MAX_SHAPES + i;
		struct fw_shape *s = bpf_map_lookup_elem(&fw_shapes, &si);
		if (!s)
			break;
		struct fw_key k = {
			.src = p.src & s->src_mask,
			.dst = p.dst & s->dst_mask,
			.sport = p.sport & s->sport_mask,
			.dport = p.dport & s->dport_mask,
			.proto = p.proto & s->proto_mask,
			.shape = i,
			.gen = gen,
		};
		struct fw_val *v = bpf_map_lookup_elem(&fw_rules, &k);
		if (v && v->rule < best) {
			best = v->rule;
			action = v->action;
			log = v->log;
		}
	}
	if (best == 0xffffffff) {
		count(FW_DEFAULT_DENIED);
		return XDP_DROP;
	}
	if (log) {
		struct fw_event *e = bpf_ringbuf_reserve(&fw_log, sizeof(*e), 0);
		if (e) {
			e->rule = best;
			e->src = p.src;
			e->dst = p.dst;
			e->sport = p.sport;
			e->dport = p.dport;
			e->proto = p.proto;
			e->action = action;
			e->len = (__u16)(ctx->data_end - ctx->data);
			bpf_ringbuf_submit(e, 0);
		} else {
			count(FW_LOG_LOST);
		}
	}
	if (action == FW_ACCEPT) {
		count(FW_ACCEPTED);
		return XDP_PASS;
	}
	count(FW_DENIED);
	return XDP_DROP;
}

char LICENSE[] SEC("license") = "GPL";
