// SPDX-License-Identifier: GPL-2.0
//
// Orion's explicit process sensors on the kernel PE: the scheduler's
// `sched_process_fork`, `sched_process_exec` and `sched_process_exit`
// tracepoints, for the processes of one watched cgroup v2 subtree, into a ring
// buffer that the monitor drains into its shadow process tree (the seed's
// FORK_REC records, §3.5.1). Every fork is seen, also of processes that fork
// and exit between two monitor refreshes, so lineage and the creation rate are
// exact where /proc scans can only sample.
//
// Attached as BTF-enabled tracepoints (`tp_btf/`, no tracefs needed); the
// `raw_tp/` twins are for kernels that refuse tp_btf. Task fields are read
// with CO-RE relocations against the running kernel's BTF, so the two-field
// `task_struct` below is all this file needs of the kernel's headers.
//
// The watched subtree is `orion_cfg[0]`: the cgroup's id and its level in the
// v2 hierarchy; a task is inside when its ancestor at that level is the
// cgroup. A process is its thread group: thread creation and the exit of a
// thread that is not the group leader are not reported. Layouts are mirrored
// in crates/kernel/src/orion_sched.rs; keep the two in step.

#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define ORION_EVENTS_BYTES (1 << 22) /* 4 MiB: ~87k events */

#define ORION_FORK 1
#define ORION_EXEC 2
#define ORION_EXIT 3

#define ORION_COMM_LEN 16

/* Counter slots in `orion_stats`. */
#define ORION_STAT_FORKS 0
#define ORION_STAT_EXECS 1
#define ORION_STAT_EXITS 2
#define ORION_STAT_DROPPED 3
#define ORION_STATS 4

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));

struct orion_cfg {
	__u64 cgroup_id; /* 0: watch nothing */
	__u32 level;
	__u32 pad;
};

struct orion_event {
	__u64 ts_ns; /* CLOCK_MONOTONIC */
	__u32 kind;  /* ORION_FORK, ORION_EXEC or ORION_EXIT */
	__u32 pid;   /* the process (thread group id) */
	__u32 ppid;  /* fork: the parent process; else 0 */
	__u32 uid;
	char comm[ORION_COMM_LEN];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct orion_cfg);
} orion_cfg SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, ORION_EVENTS_BYTES);
} orion_events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ORION_STATS);
	__type(key, __u32);
	__type(value, __u64);
} orion_stats SEC(".maps");

static __always_inline int watched(void)
{
	__u32 zero = 0;
	struct orion_cfg *cfg = bpf_map_lookup_elem(&orion_cfg, &zero);
	if (!cfg || cfg->cgroup_id == 0)
		return 0;
	return bpf_get_current_ancestor_cgroup_id(cfg->level) == cfg->cgroup_id;
}

static __always_inline void count(__u32 slot)
{
	__u64 *n = bpf_map_lookup_elem(&orion_stats, &slot);
	if (n)
		*n += 1;
}

static __always_inline void emit(__u32 kind, __u32 pid, __u32 ppid, __u32 stat)
{
	struct orion_event *e = bpf_ringbuf_reserve(&orion_events, sizeof(*e), 0);
	if (!e) {
		count(ORION_STAT_DROPPED);
		return;
	}
	e->ts_ns = bpf_ktime_get_ns();
	e->kind = kind;
	e->pid = pid;
	e->ppid = ppid;
	e->uid = (__u32)bpf_get_current_uid_gid();
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	bpf_ringbuf_submit(e, 0);
	count(stat);
}

/* The current task is the parent. */
static __always_inline int on_fork(struct task_struct *parent, struct task_struct *child)
{
	if (!watched())
		return 0;
	int pid = BPF_CORE_READ(child, pid);
	int tgid = BPF_CORE_READ(child, tgid);
	if (pid != tgid) /* a new thread, not a new process */
		return 0;
	emit(ORION_FORK, (__u32)tgid, (__u32)BPF_CORE_READ(parent, tgid), ORION_STAT_FORKS);
	return 0;
}

/* The current task has just exec'd: its comm is the new one. */
static __always_inline int on_exec(void)
{
	if (!watched())
		return 0;
	emit(ORION_EXEC, (__u32)(bpf_get_current_pid_tgid() >> 32), 0, ORION_STAT_EXECS);
	return 0;
}

/* The current task is exiting. */
static __always_inline int on_exit(void)
{
	if (!watched())
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)id != (__u32)(id >> 32)) /* a thread, not the group leader */
		return 0;
	emit(ORION_EXIT, (__u32)(id >> 32), 0, ORION_STAT_EXITS);
	return 0;
}

SEC("tp_btf/sched_process_fork")
int orion_fork(__u64 *ctx)
{
	return on_fork((struct task_struct *)ctx[0], (struct task_struct *)ctx[1]);
}

SEC("tp_btf/sched_process_exec")
int orion_exec(__u64 *ctx)
{
	return on_exec();
}

SEC("tp_btf/sched_process_exit")
int orion_exit(__u64 *ctx)
{
	return on_exit();
}

SEC("raw_tp/sched_process_fork")
int orion_fork_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_fork((struct task_struct *)ctx->args[0], (struct task_struct *)ctx->args[1]);
}

SEC("raw_tp/sched_process_exec")
int orion_exec_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_exec();
}

SEC("raw_tp/sched_process_exit")
int orion_exit_raw(struct bpf_raw_tracepoint_args *ctx)
{
	return on_exit();
}

char LICENSE[] SEC("license") = "GPL";
