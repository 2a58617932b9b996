// SPDX-License-Identifier: GPL-2.0
//
// Sikker's L4 mode on the kernel PE: service-to-service permissions and rate
// limits for plain TCP, for services that cannot link Sikker's client library.
//
// Three programs, attached to a cgroup v2 directory (the root of the services'
// cgroups, or each one); they see every process below it:
//
// * `sikker_connect4` / `sikker_connect6` (cgroup/connect4, cgroup/connect6)
//   run when a process calls connect(2) on a TCP socket. If the destination
//   ip:port belongs to a Sikker service (`l4_dests`), the caller's service is
//   looked up by its cgroup id (`l4_cgroups`; with the user the policy
//   requires, if it requires one) and the pair by `l4_permits`; anything not
//   found is refused, and connect(2) fails with EPERM. A
//   destination that belongs to no service is none of Sikker's business and
//   passes. IPv4-mapped IPv6 destinations are the IPv4 ones. A permitted
//   connection of a rate-limited pair is paced by TCP itself at just under
//   the pair's rate (SO_MAX_PACING_RATE), so that one connection keeps to
//   the limit without losses: on a path with a tiny RTT (loopback, a LAN),
//   TCP's window cannot slow it down enough, and a refused packet there
//   stalls the connection until its 200 ms probe timer. Its segments are
//   also capped (TCP_MAXSEG, user space chooses: a sixteenth of the bucket)
//   so that the ten segments TCP sends before pacing starts, and each TSO
//   packet, fit in the bucket; loopback's MSS is 64 KiB otherwise.
//
// * `sikker_egress` (cgroup_skb/egress) sees every IP packet the processes
//   send. A TCP packet to a service's address is charged to the token bucket
//   of its (source service, destination service) pair (`l4_rates`), which
//   holds the pair's aggregate over all its connections: over the rate the
//   packet is dropped with a congestion notification (TCP enters CWR and
//   sends it again later). It also drops packets of a pair that is not
//   (or no longer) permitted, so revoking a permission stops connections made
//   before the revocation.
//
// Counters per pair are in `l4_counts`; what passed untouched is counted in
// `l4_stats`. Struct layouts are mirrored in crates/kernel/src/sikker_l4.rs;
// keep the two in step.

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define L4_MAX_CGROUPS 65536
#define L4_MAX_DESTS 65536
#define L4_MAX_PERMITS (1 << 20)
#define L4_MAX_PAIRS 65536

/* connect(2) verdicts. */
#define L4_REFUSE 0 /* connect(2) fails with EPERM */
#define L4_ALLOW 1

/* cgroup_skb/egress verdicts (the kernel accepts 0-3 on egress). */
#define L4_DROP 0
#define L4_PASS 1
#define L4_DROP_CN 2 /* drop, and tell TCP the path is congested (NET_XMIT_CN) */

/* The counters' source for a process in no mapped cgroup: the Network OS's
 * service id, which no policy service can have (Sikker's NOS_SERVICE). */
#define L4_NO_SERVICE 0xffffffff
#define L4_ANY_UID 0xffffffff

#define L4_SOCK_STREAM 1
#define L4_SOL_SOCKET 1          /* asm-generic/socket.h */
#define L4_SO_MAX_PACING_RATE 47 /* bytes per second, an int for bpf_setsockopt */
#define L4_SOL_TCP 6
#define L4_TCP_MAXSEG 2
#define NSEC_PER_SEC 1000000000ULL
/* The deepest a bucket goes into debt, bytes: more than any packet (64 KiB
 * GSO, 512 KiB BIG TCP). */
#define L4_MAX_DEBT (16ULL << 20)

/* An L4 address: IPv4 as IPv4-mapped IPv6 (::ffff:a.b.c.d), so one key covers
 * connect4, connect6 to a mapped address, and the packets of both. */
struct l4_addr {
	__u32 ip[4]; /* network byte order */
	__u16 port;  /* host byte order */
	__u16 pad;
};

/* A (service, process) of the policy. */
struct l4_peer {
	__u32 service;
	__u32 process;
};

/* The (service, process) of a cgroup's processes, and the user they must run
 * as to connect as it (L4_ANY_UID: any). */
struct l4_source {
	__u32 service;
	__u32 process;
	__u32 uid;
};

/* May `src` (a service) connect to `dst` (an address)? */
struct l4_permit_key {
	__u32 src;
	struct l4_addr dst;
};

/* An ordered pair of services. */
struct l4_pair {
	__u32 src;
	__u32 dst;
};

/* A token bucket. Tokens are kept in nanobytes (bytes x 1e9) so that refilling
 * is one multiplication, exact however often packets come. */
struct l4_bucket {
	struct bpf_spin_lock lock;
	__u32 mss;       /* the pair's connections' largest segment (0: as TCP chooses) */
	__u64 rate;      /* bytes per second */
	__u64 burst_nb;  /* bucket size, nanobytes */
	__u64 fill_ns;   /* time to fill the bucket from the deepest debt,
			  * (burst + L4_MAX_DEBT) x 1e9 / rate, rounded up */
	__s64 tokens_nb; /* available now; below zero by at most one packet
			  * (a debt), and never below -L4_MAX_DEBT */
	__u64 last_ns;   /* last refill (0: never; the bucket starts full) */
};

/* What happened to one pair. */
struct l4_counts {
	__u64 connects_allowed;
	__u64 connects_denied;
	__u64 packets_passed;
	__u64 bytes_passed;
	__u64 packets_dropped; /* over the rate */
	__u64 bytes_dropped;
	__u64 packets_denied; /* of a pair that is not permitted */
	__u64 bytes_denied;
};

/* What passed without being Sikker's business, and connections paced. */
enum l4_stat {
	L4_CONNECT_UNMANAGED = 0, /* connect to an address of no service */
	L4_CONNECT_NOT_TCP = 1,   /* connect on a UDP (or other) socket */
	L4_EGRESS_UNMANAGED = 2,  /* packet to an address of no service */
	L4_EGRESS_UNPARSED = 3,   /* not IPv4/IPv6 carrying TCP right after the IP header */
	L4_CONNECT_PACED = 4,     /* permitted connect, paced at its pair's rate */
	L4_STATS = 5,
};

/* Which (service, process) each cgroup's processes are: cgroup v2 id (the
 * directory's inode number) -> source. Written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, L4_MAX_CGROUPS);
	__type(key, __u64);
	__type(value, struct l4_source);
} l4_cgroups SEC(".maps");

/* Which (service, process) listens at each address Sikker manages:
 * address -> peer. Written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, L4_MAX_DESTS);
	__type(key, struct l4_addr);
	__type(value, struct l4_peer);
} l4_dests SEC(".maps");

/* Permitted (source service, destination address) -> the destination it
 * reaches. Absent: refused. Written by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, L4_MAX_PERMITS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct l4_permit_key);
	__type(value, struct l4_peer);
} l4_permits SEC(".maps");

/* Rate limit of each (source service, destination service) pair: its token
 * bucket. Absent: unlimited. Written by user space, updated by the program. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, L4_MAX_PAIRS);
	__type(key, struct l4_pair);
	__type(value, struct l4_bucket);
} l4_rates SEC(".maps");

/* Counters per (source service, destination service), per CPU; created by the
 * program on a pair's first event. Read by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, L4_MAX_PAIRS);
	__type(key, struct l4_pair);
	__type(value, struct l4_counts);
} l4_counts SEC(".maps");

/* Events outside Sikker's business (enum l4_stat), per CPU. Read by user space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, L4_STATS);
	__type(key, __u32);
	__type(value, __u64);
} l4_stats SEC(".maps");

static __always_inline void stat(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&l4_stats, &which);
	if (c)
		*c += 1;
}

/* The counters of a pair, created if it has none yet. */
static __always_inline struct l4_counts *counts(__u32 src, __u32 dst)
{
	struct l4_pair k = { .src = src, .dst = dst };
	struct l4_counts *c = bpf_map_lookup_elem(&l4_counts, &k);
	if (c)
		return c;
	struct l4_counts zero = {};
	bpf_map_update_elem(&l4_counts, &k, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&l4_counts, &k);
}

/* The service of a cgroup, or L4_NO_SERVICE. */
static __always_inline __u32 service_of(__u64 cgroup)
{
	struct l4_source *p = bpf_map_lookup_elem(&l4_cgroups, &cgroup);
	return p ? p->service : L4_NO_SERVICE;
}

/* The service of the calling process (by its cgroup, and its user when the
 * policy requires one), or L4_NO_SERVICE. */
static __always_inline __u32 caller_service(void)
{
	__u64 cgroup = bpf_get_current_cgroup_id();
	struct l4_source *p = bpf_map_lookup_elem(&l4_cgroups, &cgroup);
	if (!p)
		return L4_NO_SERVICE;
	if (p->uid != L4_ANY_UID && p->uid != (__u32)bpf_get_current_uid_gid())
		return L4_NO_SERVICE;
	return p->service;
}

/* The connect(2) decision, once the destination is known. */
static __always_inline int decide_connect(struct bpf_sock_addr *ctx, struct l4_addr *dst)
{
	if (ctx->type != L4_SOCK_STREAM || ctx->protocol != IPPROTO_TCP) {
		stat(L4_CONNECT_NOT_TCP);
		return L4_ALLOW;
	}
	struct l4_peer *to = bpf_map_lookup_elem(&l4_dests, dst);
	if (!to) {
		stat(L4_CONNECT_UNMANAGED);
		return L4_ALLOW;
	}
	__u32 to_service = to->service;
	struct l4_permit_key k = { .src = caller_service(), .dst = *dst };
	int allowed = k.src != L4_NO_SERVICE && bpf_map_lookup_elem(&l4_permits, &k) != 0;
	struct l4_counts *c = counts(k.src, to_service);
	if (c) {
		if (allowed)
			c->connects_allowed += 1;
		else
			c->connects_denied += 1;
	}
	if (!allowed)
		return L4_REFUSE;
	struct l4_pair pair = { .src = k.src, .dst = to_service };
	struct l4_bucket *b = bpf_map_lookup_elem(&l4_rates, &pair);
	/* 2% under the rate: the bucket also counts the IP and TCP headers,
	 * pacing only what TCP sends. Faster than an int holds: not paced. */
	if (b && b->rate < 0x7fffffff) {
		int pace = (int)(b->rate - b->rate / 50);
		if (bpf_setsockopt(ctx, L4_SOL_SOCKET, L4_SO_MAX_PACING_RATE, &pace, sizeof(pace)) == 0)
			stat(L4_CONNECT_PACED);
		int mss = (int)b->mss;
		if (mss)
			bpf_setsockopt(ctx, L4_SOL_TCP, L4_TCP_MAXSEG, &mss, sizeof(mss));
	}
	return L4_ALLOW;
}

SEC("cgroup/connect4")
int sikker_connect4(struct bpf_sock_addr *ctx)
{
	struct l4_addr dst = {
		.ip = { 0, 0, bpf_htonl(0xffff), ctx->user_ip4 },
		.port = bpf_ntohs((__u16)ctx->user_port),
	};
	return decide_connect(ctx, &dst);
}

SEC("cgroup/connect6")
int sikker_connect6(struct bpf_sock_addr *ctx)
{
	struct l4_addr dst = {
		.ip = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] },
		.port = bpf_ntohs((__u16)ctx->user_port),
	};
	return decide_connect(ctx, &dst);
}

/* Reads the destination of a TCP packet (the skb starts at the IP header).
 * 0 when it is one, -1 otherwise. */
static __always_inline int tcp_destination(struct __sk_buff *skb, struct l4_addr *dst)
{
	__u16 port;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) < 0)
			return -1;
		/* Later fragments carry no TCP header. */
		if (ip.protocol != IPPROTO_TCP || (ip.frag_off & bpf_htons(0x1fff)))
			return -1;
		__u32 ihl = ip.ihl * 4;
		if (ihl < sizeof(ip) || bpf_skb_load_bytes(skb, ihl + 2, &port, sizeof(port)) < 0)
			return -1;
		dst->ip[0] = 0;
		dst->ip[1] = 0;
		dst->ip[2] = bpf_htonl(0xffff);
		dst->ip[3] = ip.daddr;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, 0, &ip6, sizeof(ip6)) < 0)
			return -1;
		/* Extension headers are not followed: such packets pass, counted. */
		if (ip6.nexthdr != IPPROTO_TCP ||
		    bpf_skb_load_bytes(skb, sizeof(ip6) + 2, &port, sizeof(port)) < 0)
			return -1;
		__builtin_memcpy(dst->ip, &ip6.daddr, sizeof(dst->ip));
	} else {
		return -1;
	}
	dst->port = bpf_ntohs(port);
	dst->pad = 0;
	return 0;
}

/* Takes `len` bytes from a bucket: 1 if the packet may pass. A packet passes
 * while any tokens are left and may take the bucket below zero (a debt that
 * later refills repay first), so a bucket smaller than one packet (loopback's
 * TSO packets reach 128 KiB) still passes traffic at the rate. */
static __always_inline int take(struct l4_bucket *b, __u64 len)
{
	__u64 now = bpf_ktime_get_ns();
	int pass;
	bpf_spin_lock(&b->lock);
	if (b->last_ns == 0) {
		b->tokens_nb = b->burst_nb;
		b->last_ns = now;
	} else if (now > b->last_ns) {
		/* (Another CPU may have refilled after this one read the clock.) */
		__u64 elapsed = now - b->last_ns;
		if (elapsed >= b->fill_ns) {
			b->tokens_nb = b->burst_nb;
		} else {
			/* elapsed < fill_ns, so elapsed * rate <= (burst + debt) x 1e9
			 * + rate: no overflow within the limits user space enforces
			 * (burst <= 4 GiB, rate <= 1 TiB/s). */
			__s64 t = b->tokens_nb + (__s64)(elapsed * b->rate);
			b->tokens_nb = t > (__s64)b->burst_nb ? (__s64)b->burst_nb : t;
		}
		b->last_ns = now;
	}
	pass = b->tokens_nb > 0;
	if (pass) {
		__u64 cost = len < L4_MAX_DEBT ? len : L4_MAX_DEBT;
		b->tokens_nb -= (__s64)(cost * NSEC_PER_SEC);
		if (b->tokens_nb < -(__s64)(L4_MAX_DEBT * NSEC_PER_SEC))
			b->tokens_nb = -(__s64)(L4_MAX_DEBT * NSEC_PER_SEC);
	}
	bpf_spin_unlock(&b->lock);
	return pass;
}

SEC("cgroup_skb/egress")
int sikker_egress(struct __sk_buff *skb)
{
	struct l4_addr dst = {};
	if (tcp_destination(skb, &dst) < 0) {
		stat(L4_EGRESS_UNPARSED);
		return L4_PASS;
	}
	struct l4_peer *to = bpf_map_lookup_elem(&l4_dests, &dst);
	if (!to) {
		stat(L4_EGRESS_UNMANAGED);
		return L4_PASS;
	}
	struct l4_pair pair = { .src = service_of(bpf_skb_cgroup_id(skb)), .dst = to->service };
	__u64 len = skb->len;
	struct l4_counts *c = counts(pair.src, pair.dst);

	struct l4_permit_key k = { .src = pair.src, .dst = dst };
	if (pair.src == L4_NO_SERVICE || !bpf_map_lookup_elem(&l4_permits, &k)) {
		if (c) {
			c->packets_denied += 1;
			c->bytes_denied += len;
		}
		return L4_DROP;
	}
	struct l4_bucket *b = bpf_map_lookup_elem(&l4_rates, &pair);
	if (b && !take(b, len)) {
		if (c) {
			c->packets_dropped += 1;
			c->bytes_dropped += len;
		}
		return L4_DROP_CN;
	}
	if (c) {
		c->packets_passed += 1;
		c->bytes_passed += len;
	}
	return L4_PASS;
}

char LICENSE[] SEC("license") = "GPL";
