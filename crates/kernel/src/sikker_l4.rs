//! Sikker's L4 mode on the kernel PE: loads `bpf/sikker_l4.bpf.c`, attaches
//! its `cgroup/connect4`, `cgroup/connect6` and `cgroup_skb/egress` programs to
//! cgroup v2 directories, fills its maps from plain data ([`L4Tables`]: which
//! service each cgroup is, which service listens at each address, which
//! pairs are permitted, each pair's rate) and reads its counters back.
//!
//! The programs refuse (EPERM) a TCP connect to an address of a Sikker service
//! unless the caller's cgroup is a service permitted to reach it (run by the
//! user the policy requires, if it requires one); pace each permitted
//! connection of a rate-limited pair at just under its rate (with its
//! segments capped to a sixteenth of the bucket); and hold every pair's
//! aggregate to its token bucket on egress. Addresses of no service pass
//! untouched. Attachments are BPF links owned by this process: dropping the
//! [`SikkerL4`], or the process dying, detaches them.
//!
//! [`SikkerL4::install`] replaces the tables live: new entries are written
//! before stale ones are deleted, so a pair permitted before and after an
//! update is never refused in between, and a rate that did not change keeps
//! its bucket.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap};
use aya::programs::cgroup_skb::CgroupSkbLinkId;
use aya::programs::cgroup_sock_addr::CgroupSockAddrLinkId;
use aya::programs::{CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSockAddr};

use crate::error::{KernelError, chain};
use crate::objects;

/// The object's name in errors.
const OBJECT: &str = "sikker_l4";
/// The programs, by their names in the object.
pub const CONNECT4: &str = "sikker_connect4";
pub const CONNECT6: &str = "sikker_connect6";
pub const EGRESS: &str = "sikker_egress";
/// The source the counters give a process in no mapped cgroup (Sikker's
/// `NOS_SERVICE`, which no policy service can have).
pub const NO_SERVICE: u32 = u32::MAX;
/// A source's uid when any user may connect as it (`L4_ANY_UID`).
const ANY_UID: u32 = u32::MAX;
/// The largest rate a bucket takes, bytes/s (1 TiB/s; above, the program's
/// arithmetic could overflow). A faster limit is no limit on one host.
pub const MAX_RATE: u64 = 1 << 40;
/// The largest bucket, bytes (4 GiB).
pub const MAX_BUCKET: u64 = 1 << 32;
/// The deepest a bucket goes into debt, bytes (`L4_MAX_DEBT`).
const MAX_DEBT: u64 = 16 << 20;
/// `statfs` magic of cgroup v2 (`CGROUP2_SUPER_MAGIC`).
const CGROUP2_MAGIC: i64 = 0x6367_7270;
/// How the programs attach. aya attaches through BPF links (kernel 5.7 and
/// later), which always run beside other programs of the cgroup and take no
/// flags: the kernel refuses BPF_F_ALLOW_MULTI on a link with EINVAL.
const MODE: CgroupAttachMode = CgroupAttachMode::Single;

// The map layouts of bpf/sikker_l4.bpf.c, field for field.

/// `struct l4_addr`: IPv6 (IPv4 mapped) in network order, port in host order.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct RawAddr {
    ip: [u8; 16],
    port: u16,
    pad: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RawPeer {
    service: u32,
    process: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RawSource {
    service: u32,
    process: u32,
    uid: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RawPermitKey {
    src: u32,
    dst: RawAddr,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct RawPair {
    src: u32,
    dst: u32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawBucket {
    /// `struct bpf_spin_lock`: the kernel ignores it on updates from user space.
    lock: u32,
    mss: u32,
    rate: u64,
    burst_nb: u64,
    fill_ns: u64,
    tokens_nb: i64,
    last_ns: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct RawCounts {
    connects_allowed: u64,
    connects_denied: u64,
    packets_passed: u64,
    bytes_passed: u64,
    packets_dropped: u64,
    bytes_dropped: u64,
    packets_denied: u64,
    bytes_denied: u64,
}

// SAFETY: plain `repr(C)` structs of integers whose every byte is a field
// (the `pad` fields included; sizes checked in the tests below), valid for
// any bit pattern.
unsafe impl aya::Pod for RawAddr {}
// SAFETY: as above.
unsafe impl aya::Pod for RawPeer {}
// SAFETY: as above.
unsafe impl aya::Pod for RawSource {}
// SAFETY: as above.
unsafe impl aya::Pod for RawPermitKey {}
// SAFETY: as above.
unsafe impl aya::Pod for RawPair {}
// SAFETY: as above.
unsafe impl aya::Pod for RawBucket {}
// SAFETY: as above.
unsafe impl aya::Pod for RawCounts {}

impl RawAddr {
    fn of(a: SocketAddr) -> RawAddr {
        let ip = match a.ip() {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        RawAddr {
            ip: ip.octets(),
            port: a.port(),
            pad: 0,
        }
    }
}

/// A (service, process) of the policy, by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct L4Peer {
    pub service: u32,
    pub process: u32,
}

/// Who a cgroup's processes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct L4Source {
    pub service: u32,
    pub process: u32,
    /// The user they must run as to connect as this process (checked at
    /// connect); `None`: any.
    pub uid: Option<u32>,
}

/// A pair's rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L4Rate {
    /// Bytes per second, 1 to [`MAX_RATE`] (IP packets, headers included).
    pub bytes_per_sec: u64,
    /// Bucket size, bytes, 1 to [`MAX_BUCKET`]: what may pass at once after
    /// an idle spell.
    pub bucket_bytes: u64,
}

/// Everything the programs need, as plain data. IPv4 addresses and their
/// IPv4-mapped IPv6 forms are the same address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L4Tables {
    /// Which (service, process) each cgroup's processes are, by cgroup id
    /// ([`cgroup_id`]).
    pub cgroups: BTreeMap<u64, L4Source>,
    /// Which (service, process) listens at each address Sikker manages. A
    /// connect to any of these is refused unless permitted.
    pub destinations: BTreeMap<SocketAddr, L4Peer>,
    /// (source service, destination address): permitted. Every address must
    /// be one of `destinations`.
    pub permits: BTreeSet<(u32, SocketAddr)>,
    /// (source service, destination service) → its rate; a pair without one
    /// is unlimited.
    pub rates: BTreeMap<(u32, u32), L4Rate>,
}

/// What happened to one (source, destination) pair, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L4PairCounters {
    /// The source service; `None` for processes in no mapped cgroup.
    pub src: Option<u32>,
    /// The destination service.
    pub dst: u32,
    pub connects_allowed: u64,
    pub connects_denied: u64,
    pub packets_passed: u64,
    pub bytes_passed: u64,
    /// Over the rate (dropped with a congestion notification).
    pub packets_dropped: u64,
    pub bytes_dropped: u64,
    /// Of a pair not (or no longer) permitted.
    pub packets_denied: u64,
    pub bytes_denied: u64,
}

/// What passed without being Sikker's business, and connections paced,
/// summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L4Totals {
    /// Connects to an address of no service.
    pub connects_unmanaged: u64,
    /// Connects on a socket that is not TCP.
    pub connects_not_tcp: u64,
    /// Packets to an address of no service.
    pub packets_unmanaged: u64,
    /// Packets that are not TCP right after an IPv4/IPv6 header.
    pub packets_unparsed: u64,
    /// Permitted connects of a rate-limited pair, paced by TCP at just under
    /// the pair's rate.
    pub connects_paced: u64,
}

/// Every counter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct L4Counters {
    /// By (source, destination), in that order.
    pub pairs: Vec<L4PairCounters>,
    pub totals: L4Totals,
}

/// What [`SikkerL4::install`] changed, entries per map.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct L4Update {
    pub written: usize,
    pub removed: usize,
}

/// The links of the three programs in one cgroup.
struct Attachment {
    dir: PathBuf,
    connect4: CgroupSockAddrLinkId,
    connect6: CgroupSockAddrLinkId,
    egress: CgroupSkbLinkId,
}

/// The L4 programs: loaded, their maps, and where they are attached.
pub struct SikkerL4 {
    ebpf: Ebpf,
    cgroups: HashMap<MapData, u64, RawSource>,
    dests: HashMap<MapData, RawAddr, RawPeer>,
    permits: HashMap<MapData, RawPermitKey, RawPeer>,
    rates: HashMap<MapData, RawPair, RawBucket>,
    counts: PerCpuHashMap<MapData, RawPair, RawCounts>,
    stats: PerCpuArray<MapData, u64>,
    /// What the maps hold now.
    installed: L4Tables,
    attached: Vec<Attachment>,
}

fn map_err(map: &str) -> impl Fn(aya::maps::MapError) -> KernelError + '_ {
    move |e| KernelError::Map {
        map: map.to_string(),
        detail: chain(&e),
    }
}

fn missing(what: &'static str, name: &str) -> KernelError {
    KernelError::Missing {
        object: OBJECT.into(),
        what,
        name: name.to_string(),
    }
}

fn verify_err(program: &str) -> impl Fn(aya::programs::ProgramError) -> KernelError + '_ {
    move |e| crate::error::refused(program, &e)
}

/// Takes map `name` out of the object, typed.
fn take<T>(ebpf: &mut Ebpf, name: &str) -> Result<T, KernelError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let m = ebpf.take_map(name).ok_or_else(|| missing("map", name))?;
    T::try_from(m).map_err(map_err(name))
}

/// Checks that `dir` is a directory of a cgroup v2 file system.
fn check_cgroup2(dir: &Path) -> Result<(), KernelError> {
    let bad = |detail: String| KernelError::NotCgroup2 {
        path: dir.display().to_string(),
        detail,
    };
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| bad("the path contains a NUL byte".into()))?;
    // SAFETY: an all-zero `statfs` is a valid value of this plain C struct.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a writable statfs that
    // outlives the call.
    if unsafe { libc::statfs(c.as_ptr(), &raw mut st) } != 0 {
        return Err(bad(std::io::Error::last_os_error().to_string()));
    }
    #[allow(clippy::useless_conversion)] // f_type is an i64 here, narrower on some targets
    let f_type = i64::from(st.f_type);
    if f_type != CGROUP2_MAGIC {
        return Err(bad(format!(
            "its file system is not cgroup2 (magic {:#x}); mount cgroup v2 or give a directory under its mount point",
            st.f_type
        )));
    }
    if !dir.is_dir() {
        return Err(bad("not a directory".into()));
    }
    Ok(())
}

/// The id of the cgroup v2 directory `dir`: what `bpf_get_current_cgroup_id()`
/// returns for its processes (the directory's inode number).
pub fn cgroup_id(dir: &Path) -> Result<u64, KernelError> {
    check_cgroup2(dir)?;
    std::fs::metadata(dir)
        .map(|m| m.ino())
        .map_err(|e| KernelError::NotCgroup2 {
            path: dir.display().to_string(),
            detail: e.to_string(),
        })
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified`
/// on a hybrid system), from `/proc/self/mountinfo`.
pub fn cgroup2_root() -> Option<PathBuf> {
    let m = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    m.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if !post.starts_with("cgroup2 ") {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// A bucket for `r`, full.
fn bucket(src: u32, dst: u32, r: L4Rate) -> Result<RawBucket, KernelError> {
    if !(1..=MAX_RATE).contains(&r.bytes_per_sec) || !(1..=MAX_BUCKET).contains(&r.bucket_bytes) {
        return Err(KernelError::L4Tables(format!(
            "the rate of {src} → {dst} is {} bytes/s with a {}-byte bucket; rates go from 1 to {MAX_RATE} bytes/s and buckets from 1 to {MAX_BUCKET} bytes",
            r.bytes_per_sec, r.bucket_bytes
        )));
    }
    let burst_nb = u128::from(r.bucket_bytes) * 1_000_000_000;
    let deepest_nb = u128::from(r.bucket_bytes + MAX_DEBT) * 1_000_000_000;
    let fill_ns = deepest_nb.div_ceil(u128::from(r.bytes_per_sec));
    let burst_nb = u64::try_from(burst_nb).expect("bucket ≤ 2^32 bytes, times 1e9, fits");
    Ok(RawBucket {
        mss: mss_for(r.bucket_bytes),
        rate: r.bytes_per_sec,
        burst_nb,
        fill_ns: u64::try_from(fill_ns).expect("≤ (2^32 + 2^24) x 1e9"),
        tokens_nb: i64::try_from(burst_nb).expect("≤ 2^62"),
        ..RawBucket::default()
    })
}

/// The largest TCP segment for a pair with this bucket: a sixteenth of it, so
/// that the ten segments TCP sends before its pacing starts fit in the bucket
/// with room to spare (and TSO packets, at least two segments, too). 0 (as
/// TCP chooses) when that is above what TCP_MAXSEG takes (32,767); never
/// below 536, TCP's default.
fn mss_for(bucket_bytes: u64) -> u32 {
    match bucket_bytes / 16 {
        m if m > 32_767 => 0,
        m => u32::try_from(m.max(536)).expect("≤ 32767"),
    }
}

/// Deletes `k` from a map; a key already gone is fine.
fn remove<K: aya::Pod, V: aya::Pod>(
    m: &mut HashMap<MapData, K, V>,
    k: &K,
    name: &str,
) -> Result<(), KernelError> {
    match m.remove(k) {
        Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
        Err(e) => Err(map_err(name)(e)),
    }
}

impl SikkerL4 {
    /// Loads the object and its three programs into the kernel (the verifier
    /// runs here). Nothing is attached yet, and the maps are empty.
    pub fn load() -> Result<SikkerL4, KernelError> {
        let mut ebpf = Ebpf::load(objects::sikker_l4()).map_err(|e| KernelError::Load {
            object: OBJECT.into(),
            detail: chain(&e),
        })?;
        for name in [CONNECT4, CONNECT6] {
            let p: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or_else(|| missing("program", name))?
                .try_into()
                .map_err(verify_err(name))?;
            p.load().map_err(verify_err(name))?;
        }
        let p: &mut CgroupSkb = ebpf
            .program_mut(EGRESS)
            .ok_or_else(|| missing("program", EGRESS))?
            .try_into()
            .map_err(verify_err(EGRESS))?;
        p.load().map_err(verify_err(EGRESS))?;
        Ok(SikkerL4 {
            cgroups: take(&mut ebpf, "l4_cgroups")?,
            dests: take(&mut ebpf, "l4_dests")?,
            permits: take(&mut ebpf, "l4_permits")?,
            rates: take(&mut ebpf, "l4_rates")?,
            counts: take(&mut ebpf, "l4_counts")?,
            stats: take(&mut ebpf, "l4_stats")?,
            ebpf,
            installed: L4Tables::default(),
            attached: Vec::new(),
        })
    }

    /// Attaches the three programs to the cgroup v2 directory `dir`: they see
    /// every process in it and below. Other programs attached there keep
    /// running (a BPF link runs beside them). Attaching where it already is does nothing.
    pub fn attach(&mut self, dir: &Path) -> Result<(), KernelError> {
        check_cgroup2(dir)?;
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        if self.attached.iter().any(|a| a.dir == dir) {
            return Ok(());
        }
        let fd = File::open(&dir).map_err(|e| KernelError::NotCgroup2 {
            path: dir.display().to_string(),
            detail: e.to_string(),
        })?;
        let err = |program: &str| {
            let cgroup = dir.display().to_string();
            let program = program.to_string();
            move |e: aya::programs::ProgramError| KernelError::CgroupAttach {
                program,
                cgroup,
                detail: chain(&e),
            }
        };
        let connect4 = self.sock_addr(CONNECT4)?;
        let c4 = connect4.attach(&fd, MODE).map_err(err(CONNECT4))?;
        let connect6 = self.sock_addr(CONNECT6)?;
        let c6 = match connect6.attach(&fd, MODE) {
            Ok(id) => id,
            Err(e) => {
                let _ = self.sock_addr(CONNECT4)?.detach(c4);
                return Err(err(CONNECT6)(e));
            }
        };
        let egress = self.skb()?;
        let eg = match egress.attach(&fd, CgroupSkbAttachType::Egress, MODE) {
            Ok(id) => id,
            Err(e) => {
                let _ = self.sock_addr(CONNECT4)?.detach(c4);
                let _ = self.sock_addr(CONNECT6)?.detach(c6);
                return Err(err(EGRESS)(e));
            }
        };
        self.attached.push(Attachment {
            dir,
            connect4: c4,
            connect6: c6,
            egress: eg,
        });
        Ok(())
    }

    fn sock_addr(&mut self, name: &str) -> Result<&mut CgroupSockAddr, KernelError> {
        self.ebpf
            .program_mut(name)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| missing("program", name))
    }

    fn skb(&mut self) -> Result<&mut CgroupSkb, KernelError> {
        self.ebpf
            .program_mut(EGRESS)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| missing("program", EGRESS))
    }

    /// Detaches from `dir`, if attached there.
    pub fn detach(&mut self, dir: &Path) {
        let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let Some(i) = self.attached.iter().position(|a| a.dir == dir) else {
            return;
        };
        let a = self.attached.swap_remove(i);
        // The links are this process's; closing one cannot leave its program
        // attached, so an error here has nothing to undo.
        if let Ok(p) = self.sock_addr(CONNECT4) {
            let _ = p.detach(a.connect4);
        }
        if let Ok(p) = self.sock_addr(CONNECT6) {
            let _ = p.detach(a.connect6);
        }
        if let Ok(p) = self.skb() {
            let _ = p.detach(a.egress);
        }
    }

    /// Detaches from every directory.
    pub fn detach_all(&mut self) {
        for dir in self.attached_to() {
            self.detach(&dir);
        }
    }

    /// The directories it is attached to.
    pub fn attached_to(&self) -> Vec<PathBuf> {
        self.attached.iter().map(|a| a.dir.clone()).collect()
    }

    /// What the maps hold now.
    pub fn tables(&self) -> &L4Tables {
        &self.installed
    }

    /// Makes the maps hold exactly `t`: new and changed entries first (an
    /// unchanged rate keeps its bucket), then stale ones go. Refused before
    /// anything is written when an entry is out of range or a permit names
    /// an address that is no destination.
    pub fn install(&mut self, t: &L4Tables) -> Result<L4Update, KernelError> {
        let mut buckets = BTreeMap::new();
        for (&(src, dst), &r) in &t.rates {
            buckets.insert((src, dst), bucket(src, dst, r)?);
        }
        let dest_of = |a: &SocketAddr| t.destinations.get(a).copied();
        for (src, a) in &t.permits {
            if dest_of(a).is_none() {
                return Err(KernelError::L4Tables(format!(
                    "service {src} is permitted to reach {a}, which is no destination"
                )));
            }
        }
        let old = std::mem::take(&mut self.installed);
        let mut u = L4Update::default();
        self.write(t, &old, &buckets, &mut u)?;
        self.prune(t, &old, &mut u)?;
        self.installed = t.clone();
        Ok(u)
    }

    fn write(
        &mut self,
        t: &L4Tables,
        old: &L4Tables,
        buckets: &BTreeMap<(u32, u32), RawBucket>,
        u: &mut L4Update,
    ) -> Result<(), KernelError> {
        let peer = |p: L4Peer| RawPeer {
            service: p.service,
            process: p.process,
        };
        for (&id, &p) in &t.cgroups {
            if old.cgroups.get(&id) != Some(&p) {
                let src = RawSource {
                    service: p.service,
                    process: p.process,
                    uid: p.uid.unwrap_or(ANY_UID),
                };
                self.cgroups
                    .insert(id, src, 0)
                    .map_err(map_err("l4_cgroups"))?;
                u.written += 1;
            }
        }
        for (&a, &p) in &t.destinations {
            if old.destinations.get(&a) != Some(&p) {
                self.dests
                    .insert(RawAddr::of(a), peer(p), 0)
                    .map_err(map_err("l4_dests"))?;
                u.written += 1;
            }
        }
        for &(src, a) in &t.permits {
            let to = t.destinations[&a];
            if !old.permits.contains(&(src, a)) || old.destinations.get(&a) != Some(&to) {
                let k = RawPermitKey {
                    src,
                    dst: RawAddr::of(a),
                };
                self.permits
                    .insert(k, peer(to), 0)
                    .map_err(map_err("l4_permits"))?;
                u.written += 1;
            }
        }
        for (&(src, dst), &r) in &t.rates {
            if old.rates.get(&(src, dst)) != Some(&r) {
                self.rates
                    .insert(RawPair { src, dst }, buckets[&(src, dst)], 0)
                    .map_err(map_err("l4_rates"))?;
                u.written += 1;
            }
        }
        Ok(())
    }

    fn prune(&mut self, t: &L4Tables, old: &L4Tables, u: &mut L4Update) -> Result<(), KernelError> {
        for &(src, a) in old.permits.difference(&t.permits) {
            let k = RawPermitKey {
                src,
                dst: RawAddr::of(a),
            };
            remove(&mut self.permits, &k, "l4_permits")?;
            u.removed += 1;
        }
        for a in old.destinations.keys() {
            if !t.destinations.contains_key(a) {
                remove(&mut self.dests, &RawAddr::of(*a), "l4_dests")?;
                u.removed += 1;
            }
        }
        for id in old.cgroups.keys() {
            if !t.cgroups.contains_key(id) {
                remove(&mut self.cgroups, id, "l4_cgroups")?;
                u.removed += 1;
            }
        }
        for &(src, dst) in old.rates.keys() {
            if !t.rates.contains_key(&(src, dst)) {
                remove(&mut self.rates, &RawPair { src, dst }, "l4_rates")?;
                u.removed += 1;
            }
        }
        Ok(())
    }

    /// Every counter, summed over CPUs.
    pub fn counters(&self) -> Result<L4Counters, KernelError> {
        let mut pairs = Vec::new();
        for item in self.counts.iter() {
            let (k, per_cpu) = item.map_err(map_err("l4_counts"))?;
            let mut p = L4PairCounters {
                src: (k.src != NO_SERVICE).then_some(k.src),
                dst: k.dst,
                ..L4PairCounters::default()
            };
            for c in per_cpu.iter() {
                p.connects_allowed += c.connects_allowed;
                p.connects_denied += c.connects_denied;
                p.packets_passed += c.packets_passed;
                p.bytes_passed += c.bytes_passed;
                p.packets_dropped += c.packets_dropped;
                p.bytes_dropped += c.bytes_dropped;
                p.packets_denied += c.packets_denied;
                p.bytes_denied += c.bytes_denied;
            }
            pairs.push(p);
        }
        pairs.sort_by_key(|p| (p.src.unwrap_or(NO_SERVICE), p.dst));
        let mut v = [0u64; 5];
        for (i, slot) in v.iter_mut().enumerate() {
            let index = u32::try_from(i).expect("5 counters");
            *slot = self
                .stats
                .get(&index, 0)
                .map_err(map_err("l4_stats"))?
                .iter()
                .sum();
        }
        Ok(L4Counters {
            pairs,
            totals: L4Totals {
                connects_unmanaged: v[0],
                connects_not_tcp: v[1],
                packets_unmanaged: v[2],
                packets_unparsed: v[3],
                connects_paced: v[4],
            },
        })
    }
}

impl L4Counters {
    /// The counters of one pair (`None`: processes in no mapped cgroup).
    pub fn pair(&self, src: Option<u32>, dst: u32) -> L4PairCounters {
        self.pairs
            .iter()
            .find(|p| p.src == src && p.dst == dst)
            .copied()
            .unwrap_or(L4PairCounters {
                src,
                dst,
                ..L4PairCounters::default()
            })
    }
}

impl Drop for SikkerL4 {
    fn drop(&mut self) {
        self.detach_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!(std::mem::size_of::<RawAddr>(), 20);
        assert_eq!(std::mem::size_of::<RawPeer>(), 8);
        assert_eq!(std::mem::size_of::<RawSource>(), 12);
        assert_eq!(std::mem::size_of::<RawPermitKey>(), 24);
        assert_eq!(std::mem::size_of::<RawPair>(), 8);
        assert_eq!(std::mem::size_of::<RawBucket>(), 48);
        assert_eq!(std::mem::size_of::<RawCounts>(), 64);
    }

    #[test]
    fn ipv4_and_its_mapped_ipv6_form_are_one_key() {
        let v4: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let v6: SocketAddr = "[::ffff:127.0.0.1]:8080".parse().unwrap();
        assert_eq!(RawAddr::of(v4), RawAddr::of(v6));
        let a = RawAddr::of(v4);
        assert_eq!(a.ip[10..], [0xff, 0xff, 127, 0, 0, 1]);
        assert_eq!(a.port, 8080);
    }

    #[test]
    fn buckets_are_checked_and_fill_in_their_time() {
        let b = bucket(
            1,
            2,
            L4Rate {
                bytes_per_sec: 1_000_000,
                bucket_bytes: 25_000,
            },
        )
        .unwrap();
        assert_eq!(b.burst_nb, 25_000_000_000_000);
        assert_eq!(b.mss, 1562);
        assert_eq!(mss_for(1000), 536);
        assert_eq!(mss_for(16 * 32_768), 0);
        // From the deepest debt to full at 1 MB/s.
        assert_eq!(b.fill_ns, (25_000 + MAX_DEBT) * 1_000);
        assert_eq!(b.tokens_nb, 25_000_000_000_000);
        for bad in [(0, 1), (MAX_RATE + 1, 1), (1, 0), (1, MAX_BUCKET + 1)] {
            let e = bucket(
                1,
                2,
                L4Rate {
                    bytes_per_sec: bad.0,
                    bucket_bytes: bad.1,
                },
            )
            .unwrap_err();
            assert!(e.to_string().contains("the rate of 1 → 2"), "{e}");
        }
        // The extremes stay within the program's arithmetic.
        let b = bucket(
            1,
            2,
            L4Rate {
                bytes_per_sec: MAX_RATE,
                bucket_bytes: MAX_BUCKET,
            },
        )
        .unwrap();
        let most = b.fill_ns.checked_mul(b.rate).unwrap();
        assert!(
            i64::try_from(most)
                .unwrap()
                .checked_add(i64::try_from(b.burst_nb).unwrap())
                .is_some()
        );
    }
}
