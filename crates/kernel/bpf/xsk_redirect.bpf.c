// SPDX-License-Identifier: GPL-2.0
//
// AF_XDP receive on the kernel PE: an XDP program that redirects every IPv4
// frame arriving on a queue to the AF_XDP socket user space put at that
// queue's index of `xsk_sockets`. Everything else (ARP above all) passes to
// the kernel's stack, and so does IPv4 on a queue with no socket: the
// redirect's fallback action is XDP_PASS.
//
// Loaded and attached by crates/kernel/src/xsk.rs; the sockets are
// crates/packetio/src/xsk.rs's.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define XSK_MAX_QUEUES 64

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, XSK_MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsk_sockets SEC(".maps");

SEC("xdp")
int sidecore_xsk(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;
	if (eth->h_proto != bpf_htons(ETH_P_IP))
		return XDP_PASS;
	return bpf_redirect_map(&xsk_sockets, ctx->rx_queue_index, XDP_PASS);
}

char LICENSE[] SEC("license") = "GPL";
