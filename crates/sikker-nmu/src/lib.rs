//! The Network Management Unit's tables and procedures (dissertation ch. 6), sans-IO.
//!
//! [`NmuTables`] holds what one host's NMU holds (Fig. 6.4, reconstructed in the digest
//! §3.2) and runs the exact procedures of §6.2: [`NmuTables::send`] (§6.2.1),
//! [`NmuTables::receive`] (§6.2.2), [`NmuTables::send_with_otp`] (§6.2.3),
//! [`NmuTables::receive_with_otp`] (§6.2.4) and [`NmuTables::send_using_otp`] (§6.2.5);
//! rate control (§6.2.6) is reported as the `rate_slot` of the outgoing message and run
//! by `sidecore-sikker-rate`.
//!
//! ## Layout: the nested maps, flattened
//!
//! | dissertation | here |
//! |---|---|
//! | InfoMap: LocalIndex → {LocalService, LocalProcess, PermissionMap, OtpNextKey, OtpMap, PeerSet} | `info[LocalIndex]`, a direct-indexed array (LocalIndex is "a simple bit selection") |
//! | PermissionMap: RemoteService → {ProcessMap, DomainSet, RateFSM} | one flat open-addressing map keyed by (resident service slot, RemoteService); shared by the co-resident processes of a service, which by §4.3 hold exactly the same permissions |
//! | ProcessMap: RemoteProcess → Address | membership: a 512-bit chunk (one cache line) per entry; Address: a host-wide translation block of 512 addresses per (RemoteService, RemoteProcess / 512), shared by every entry that permits processes of that service, since a process's address does not depend on who sends to it |
//! | DomainSet | 512-bit membership chunks (one cache line for domains 0..511) |
//! | IndexMap: (LocalService, LocalProcess) → LocalIndex | a flat open-addressing map |
//! | OtpMap: OtpKey → OTP | one flat map per process, capped, with expiry |
//! | PeerSet | `info[..].peers` |
//!
//! Chunks for identifiers of 512 and above live in a flat map keyed by (entry, chunk
//! number); identifiers below 512 (the common, dense case) reach their chunk directly
//! from the PermissionMap entry, as does the translation block. A check therefore reads
//! one 32-byte PermissionMap slot and then, independently of one another (so the CPU
//! overlaps them), one process chunk, one domain chunk and one address: two dependent
//! memory accesses, whatever the size of the tables.
//!
//! ## Gap the dissertation leaves: unbounded OTP state (erratum 18)
//!
//! OTPs expire after [`NmuConfig::otp_ttl`] and each process holds at most
//! [`NmuConfig::otp_cap`]; a full OtpMap first drops expired entries and then refuses
//! the new OTP ([`NmuError::OtpTableFull`]), so unanswered requests cannot fill a
//! responder's memory. A process's OTPs are purged when it is removed.

pub mod flat;

use flat::FlatMap;

/// A service identifier (system-wide).
pub type ServiceId = u32;
/// A process identifier (unique within its service).
pub type ProcessId = u32;
/// A domain identifier (unique within its service).
pub type DomainId = u32;
/// A resident process's register-set index on this NMU.
pub type LocalIndex = u32;
/// A one-time-permission key, local to the process that received the OTP.
pub type OtpKey = u32;

/// A SACL entry as the NMU holds it: permitted (process, address) pairs, permitted
/// domains, and the rate slot.
pub type PermissionView = (Vec<(ProcessId, Address)>, Vec<DomainId>, Option<u32>);

/// The service ID reserved for the Network OS (§6.1.4); no policy may use it.
pub const NOS_SERVICE: ServiceId = u32::MAX;

const NONE: u32 = u32::MAX;
const CHUNK_BITS: u32 = 512;
const KIND_PROC: u64 = 1 << 62;
const KIND_DOM: u64 = 1 << 61;
const FLAG_PROC_OVF: u32 = 1;
const FLAG_DOM_OVF: u32 = 2;

/// A physical network address of a process (opaque to the NMU: the NOS assigns it).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
pub struct Address(pub u32);

/// A destination or recipient: service, process, domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Triple {
    /// Service.
    pub svc: ServiceId,
    /// Process within the service.
    pub proc: ProcessId,
    /// Domain within the service.
    pub dom: DomainId,
}

impl Triple {
    /// Shorthand constructor.
    pub fn new(svc: ServiceId, proc: ProcessId, dom: DomainId) -> Self {
        Triple { svc, proc, dom }
    }
}

impl std::fmt::Display for Triple {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "(S{},P{},D{})", self.svc, self.proc, self.dom)
    }
}

/// The OTP carried in a message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OtpBlock {
    /// Where the response goes.
    pub recipient: Triple,
    /// The recipient's physical address, translated by the requester's NMU (whose
    /// tables hold it) and carried in the trusted header (S.1): the responder's NMU
    /// holds no permission for the recipient. (The dissertation does not say how the
    /// responder learns the address; this is sidecore's choice.)
    pub recipient_addr: Address,
    /// The requester, set on the response (§6.2.5) so the recipient knows where the
    /// message sequence originated.
    pub requester: Option<(ServiceId, ProcessId)>,
}

/// A message header (S.3, S.5): the source is always written by the NMU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Header {
    /// Source (service, process), derived, never claimed.
    pub src: (ServiceId, ProcessId),
    /// Destination.
    pub dst: Triple,
    /// The OTP block: on a request it carries the OTP to store (§6.2.3); on a
    /// response sent using an OTP it names the requester (§6.2.5).
    pub otp: Option<OtpBlock>,
}

/// A message the NMU lets onto the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// Physical destination.
    pub address: Address,
    /// Header to put on the wire.
    pub header: Header,
    /// The rate limit this message is subject to (index into the NOS's rate-limit
    /// table), or `None` when it bypasses rate control (§6.2.6).
    pub rate_slot: Option<u32>,
}

/// Why the NMU refused an operation (the "error flag in the register set", §6.1.3).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NmuError {
    /// No resident process has this register set.
    #[error("local index {0} is not assigned to a resident process")]
    UnknownLocalIndex(LocalIndex),
    /// The sender's service holds no permission to the destination service.
    #[error("service {src} holds no permission to service {dst}")]
    ServiceDenied {
        /// Source service.
        src: ServiceId,
        /// Destination service.
        dst: ServiceId,
    },
    /// The destination process is not in the permitted process set.
    #[error("service {src} may not reach process {proc} of service {dst}")]
    ProcessDenied {
        /// Source service.
        src: ServiceId,
        /// Destination service.
        dst: ServiceId,
        /// Denied process.
        proc: ProcessId,
    },
    /// The destination domain is not in the permitted domain set.
    #[error("service {src} may not use domain {dom} of service {dst}")]
    DomainDenied {
        /// Source service.
        src: ServiceId,
        /// Destination service.
        dst: ServiceId,
        /// Denied domain.
        dom: DomainId,
    },
    /// The sending process holds no OTP with this key (never issued, already used, or
    /// issued to another process).
    #[error("process has no one-time permission with key {0} (unknown or already used)")]
    UnknownOtp(OtpKey),
    /// The OTP existed but its lifetime ended; it has been removed.
    #[error("one-time permission {0} expired")]
    OtpExpired(OtpKey),
    /// The responder already holds its cap of live OTPs.
    #[error("process (S{svc},P{proc}) already holds {cap} one-time permissions")]
    OtpTableFull {
        /// Responder service.
        svc: ServiceId,
        /// Responder process.
        proc: ProcessId,
        /// The cap.
        cap: usize,
    },
    /// The message's destination is not resident on this NMU (S.4).
    #[error("destination (S{0},P{1}) is not resident on this NMU")]
    NotResident(ServiceId, ProcessId),
    /// A receive-with-OTP was asked for a message that carries no OTP.
    #[error("message carries no one-time permission")]
    NoOtpInMessage,
    /// A management operation named a service with no resident process.
    #[error("service {0} has no resident process on this NMU")]
    ServiceNotResident(ServiceId),
    /// A management operation would add a process that is already resident.
    #[error("process (S{0},P{1}) is already resident")]
    AlreadyResident(ServiceId, ProcessId),
    /// An identifier equal to the reserved NOS service ID, or a local index out of range.
    #[error("invalid identifier: {0}")]
    InvalidId(String),
}

/// NMU limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NmuConfig {
    /// Live OTPs a process may hold.
    pub otp_cap: usize,
    /// OTP lifetime, in the caller's time unit (ns for the agents).
    pub otp_ttl: u64,
    /// Register sets (resident processes) the NMU offers.
    pub max_local: u32,
}

impl Default for NmuConfig {
    fn default() -> Self {
        NmuConfig {
            otp_cap: 1024,
            otp_ttl: 10_000_000_000,
            max_local: 1 << 16,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct OtpEntry {
    recipient: Triple0,
    recipient_addr: u32,
    requester: (ServiceId, ProcessId),
    expires: u64,
}

#[derive(Clone, Copy, Debug, Default)]
struct Triple0 {
    svc: u32,
    proc: u32,
    dom: u32,
}

#[derive(Clone, Debug, Default)]
struct Info {
    live: bool,
    svc: ServiceId,
    proc: ProcessId,
    svc_slot: u32,
    otp_next: OtpKey,
    otps: FlatMap<OtpEntry>,
    peers: Vec<Address>,
}

/// A PermissionMap value (24 bytes; with its key, one 32-byte slot).
#[derive(Clone, Copy, Debug)]
struct PermEntry {
    proc_chunk0: u32,
    dom_chunk0: u32,
    addr_block0: u32,
    rate_slot: u32,
    id: u32,
    flags: u32,
}

impl Default for PermEntry {
    fn default() -> Self {
        PermEntry {
            proc_chunk0: NONE,
            dom_chunk0: NONE,
            addr_block0: NONE,
            rate_slot: NONE,
            id: NONE,
            flags: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
#[repr(C, align(64))]
struct Chunk([u64; 8]);

/// Addresses of 512 consecutive process IDs of one service (2 KiB, line-aligned).
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Block([u32; 512]);

impl Chunk {
    #[inline(always)]
    fn test(&self, bit: u32) -> bool {
        self.0[(bit >> 6) as usize] >> (bit & 63) & 1 == 1
    }
    fn ones(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }
}

/// A resident service's permission group: the slot shared by its resident processes.
#[derive(Clone, Debug, Default)]
struct SvcGroup {
    svc: ServiceId,
    members: u32,
}

/// Sizes of the tables, for comparison with Eq. 4.5.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct TableStats {
    /// Resident processes.
    pub processes: usize,
    /// Resident services (permission groups).
    pub services: usize,
    /// PermissionMap entries (SACL entries held).
    pub sacl_entries: usize,
    /// Permitted (service, process) pairs held, summed over entries.
    pub process_entries: usize,
    /// Permitted domains held, summed over entries.
    pub domain_entries: usize,
    /// Bytes of the PermissionMap slots.
    pub perm_bytes: usize,
    /// Bytes of the membership chunks (and their rank prefixes).
    pub chunk_bytes: usize,
    /// Bytes of the address arrays.
    pub addr_bytes: usize,
    /// Bytes of the IndexMap, InfoMap, OtpMaps and PeerSets.
    pub other_bytes: usize,
    /// Everything.
    pub total_bytes: usize,
}

/// One host's NMU.
#[derive(Clone, Debug)]
pub struct NmuTables {
    cfg: NmuConfig,
    info: Vec<Info>,
    free_local: Vec<LocalIndex>,
    index: FlatMap<u32>,
    groups: Vec<SvcGroup>,
    group_of: FlatMap<u32>,
    free_groups: Vec<u32>,
    perm: FlatMap<PermEntry>,
    next_perm_id: u32,
    chunks: Vec<Chunk>,
    chunk_map: FlatMap<u32>,
    blocks: Vec<Block>,
    block_refs: Vec<u32>,
    block_map: FlatMap<u32>,
    free_blocks: Vec<u32>,
    garbage: usize,
}

#[inline(always)]
fn perm_key(group: u32, dst: ServiceId) -> u64 {
    ((group as u64) << 32) | dst as u64
}

#[inline(always)]
fn chunk_key(kind: u64, id: u32, chunk: u32) -> u64 {
    kind | ((id as u64) << 24) | chunk as u64
}

fn check_id(what: &str, v: u32) -> Result<(), NmuError> {
    if v == u32::MAX {
        return Err(NmuError::InvalidId(format!(
            "{what} {v} is reserved (the Network OS service ID)"
        )));
    }
    Ok(())
}

impl NmuTables {
    /// Empty tables.
    pub fn new(cfg: NmuConfig) -> Self {
        NmuTables {
            cfg,
            info: Vec::new(),
            free_local: Vec::new(),
            index: FlatMap::default(),
            groups: Vec::new(),
            group_of: FlatMap::default(),
            free_groups: Vec::new(),
            perm: FlatMap::default(),
            next_perm_id: 0,
            chunks: Vec::new(),
            chunk_map: FlatMap::default(),
            blocks: Vec::new(),
            block_refs: Vec::new(),
            block_map: FlatMap::default(),
            free_blocks: Vec::new(),
            garbage: 0,
        }
    }

    /// Empty tables sized for `sacl_entries` PermissionMap entries and `blocks`
    /// translation blocks, so that bulk loading does not reallocate.
    pub fn with_capacity(cfg: NmuConfig, sacl_entries: usize, blocks: usize) -> Self {
        let mut t = Self::new(cfg);
        t.perm = FlatMap::with_capacity(sacl_entries);
        t.chunks.reserve(sacl_entries * 2);
        t.blocks.reserve(blocks);
        t.block_map = FlatMap::with_capacity(blocks);
        t
    }

    /// The configuration.
    pub fn config(&self) -> &NmuConfig {
        &self.cfg
    }

    // ---------------------------------------------------------------- management

    /// Installs a resident process (§6.1.4: before it starts) and returns its
    /// register-set index. It inherits every permission its service already holds.
    pub fn add_process(&mut self, svc: ServiceId, proc: ProcessId) -> Result<LocalIndex, NmuError> {
        check_id("service", svc)?;
        let key = perm_key(svc, proc);
        if self.index.contains(key) {
            return Err(NmuError::AlreadyResident(svc, proc));
        }
        let li = match self.free_local.pop() {
            Some(li) => li,
            None => {
                if self.info.len() as u32 >= self.cfg.max_local {
                    return Err(NmuError::InvalidId(format!(
                        "no free register set (max {})",
                        self.cfg.max_local
                    )));
                }
                self.info.push(Info::default());
                self.info.len() as u32 - 1
            }
        };
        let g = match self.group_of.get(svc as u64) {
            Some(&g) => g,
            None => {
                let g = match self.free_groups.pop() {
                    Some(g) => g,
                    None => {
                        self.groups.push(SvcGroup::default());
                        self.groups.len() as u32 - 1
                    }
                };
                self.groups[g as usize] = SvcGroup { svc, members: 0 };
                self.group_of.insert(svc as u64, g);
                g
            }
        };
        self.groups[g as usize].members += 1;
        self.info[li as usize] = Info {
            live: true,
            svc,
            proc,
            svc_slot: g,
            otp_next: 0,
            otps: FlatMap::with_capacity(0),
            peers: Vec::new(),
        };
        self.index.insert(key, li);
        Ok(li)
    }

    /// Removes a resident process (§6.1.4: when it ends), purging its OTPs. When the
    /// last process of a service goes, the service's permissions go with it.
    pub fn remove_process(&mut self, svc: ServiceId, proc: ProcessId) -> Result<(), NmuError> {
        let li = self
            .index
            .remove(perm_key(svc, proc))
            .ok_or(NmuError::NotResident(svc, proc))?;
        let g = self.info[li as usize].svc_slot;
        self.info[li as usize] = Info::default();
        self.free_local.push(li);
        let grp = &mut self.groups[g as usize];
        grp.members -= 1;
        if grp.members == 0 {
            let dsts: Vec<u64> = self
                .perm
                .iter()
                .filter(|(k, _)| (k >> 32) as u32 == g)
                .map(|(k, _)| k)
                .collect();
            for k in dsts {
                self.drop_entry(k);
            }
            self.group_of.remove(svc as u64);
            self.free_groups.push(g);
        }
        self.maybe_compact();
        Ok(())
    }

    /// The register-set index of a resident process.
    pub fn local_index(&self, svc: ServiceId, proc: ProcessId) -> Option<LocalIndex> {
        self.index.get(perm_key(svc, proc)).copied()
    }

    /// The (service, process) of a register set.
    pub fn identity(&self, li: LocalIndex) -> Option<(ServiceId, ProcessId)> {
        self.info
            .get(li as usize)
            .filter(|i| i.live)
            .map(|i| (i.svc, i.proc))
    }

    /// Sets a process's PeerSet (other processes of its service, for rate control).
    pub fn set_peers(&mut self, li: LocalIndex, peers: Vec<Address>) -> Result<(), NmuError> {
        let i = self
            .info
            .get_mut(li as usize)
            .filter(|i| i.live)
            .ok_or(NmuError::UnknownLocalIndex(li))?;
        i.peers = peers;
        Ok(())
    }

    /// A process's PeerSet.
    pub fn peers(&self, li: LocalIndex) -> &[Address] {
        self.info
            .get(li as usize)
            .map(|i| i.peers.as_slice())
            .unwrap_or(&[])
    }

    /// Installs (or replaces) the SACL entry `src → dst` for the resident service
    /// `src`: the permitted destination processes with their addresses, the permitted
    /// domains, and the rate limit slot. Duplicate identifiers are collapsed (the
    /// last address wins).
    pub fn set_permission(
        &mut self,
        src: ServiceId,
        dst: ServiceId,
        procs: &[(ProcessId, Address)],
        doms: &[DomainId],
        rate_slot: Option<u32>,
    ) -> Result<(), NmuError> {
        check_id("service", dst)?;
        let g = *self
            .group_of
            .get(src as u64)
            .ok_or(NmuError::ServiceNotResident(src))?;
        let key = perm_key(g, dst);
        if self.perm.contains(key) {
            self.drop_entry(key);
        }
        let id = self.next_perm_id;
        self.next_perm_id = self.next_perm_id.wrapping_add(1) & 0x00ff_ffff;
        let mut e = PermEntry {
            id,
            rate_slot: rate_slot.unwrap_or(NONE),
            ..Default::default()
        };
        // Processes: sort by id, group by chunk, lay addresses out in rank order.
        let mut ps: Vec<(ProcessId, Address)> = procs.to_vec();
        ps.sort_by_key(|p| p.0);
        ps.dedup_by(|later, earlier| {
            if later.0 == earlier.0 {
                earlier.1 = later.1;
                true
            } else {
                false
            }
        });
        let mut i = 0;
        while i < ps.len() {
            let c = ps[i].0 / CHUNK_BITS;
            let mut chunk = Chunk::default();
            let blk = self.block_ref(dst, c);
            while i < ps.len() && ps[i].0 / CHUNK_BITS == c {
                let b = ps[i].0 % CHUNK_BITS;
                chunk.0[(b >> 6) as usize] |= 1 << (b & 63);
                self.blocks[blk as usize].0[b as usize] = ps[i].1.0;
                i += 1;
            }
            let ci = self.push_chunk(chunk);
            if c == 0 {
                e.proc_chunk0 = ci;
                e.addr_block0 = blk;
            } else {
                e.flags |= FLAG_PROC_OVF;
                self.chunk_map.insert(chunk_key(KIND_PROC, id, c), ci);
            }
        }
        let mut ds: Vec<DomainId> = doms.to_vec();
        ds.sort_unstable();
        ds.dedup();
        let mut i = 0;
        while i < ds.len() {
            let c = ds[i] / CHUNK_BITS;
            let mut chunk = Chunk::default();
            while i < ds.len() && ds[i] / CHUNK_BITS == c {
                let b = ds[i] % CHUNK_BITS;
                chunk.0[(b >> 6) as usize] |= 1 << (b & 63);
                i += 1;
            }
            let ci = self.push_chunk(chunk);
            if c == 0 {
                e.dom_chunk0 = ci;
            } else {
                e.flags |= FLAG_DOM_OVF;
                self.chunk_map.insert(chunk_key(KIND_DOM, id, c), ci);
            }
        }
        self.perm.insert(key, e);
        self.maybe_compact();
        Ok(())
    }

    /// Removes the SACL entry `src → dst`; returns whether it existed.
    pub fn remove_permission(&mut self, src: ServiceId, dst: ServiceId) -> bool {
        let Some(&g) = self.group_of.get(src as u64) else {
            return false;
        };
        let key = perm_key(g, dst);
        if !self.perm.contains(key) {
            return false;
        }
        self.drop_entry(key);
        self.maybe_compact();
        true
    }

    /// The SACL entry `src → dst` as held: permitted (process, address) pairs, domains
    /// and rate slot.
    pub fn permission(&self, src: ServiceId, dst: ServiceId) -> Option<PermissionView> {
        let g = *self.group_of.get(src as u64)?;
        let e = *self.perm.get(perm_key(g, dst))?;
        Some(self.expand(dst, &e))
    }

    /// Destination services `src` holds permissions to.
    pub fn destinations(&self, src: ServiceId) -> Vec<ServiceId> {
        let Some(&g) = self.group_of.get(src as u64) else {
            return Vec::new();
        };
        let mut v: Vec<ServiceId> = self
            .perm
            .iter()
            .filter(|(k, _)| (k >> 32) as u32 == g)
            .map(|(k, _)| k as u32)
            .collect();
        v.sort_unstable();
        v
    }

    /// Resident services.
    pub fn resident_services(&self) -> Vec<ServiceId> {
        let mut v: Vec<ServiceId> = self.group_of.iter().map(|(k, _)| k as u32).collect();
        v.sort_unstable();
        v
    }

    /// Resident processes as (service, process, local index).
    pub fn resident_processes(&self) -> Vec<(ServiceId, ProcessId, LocalIndex)> {
        let mut v: Vec<_> = self
            .index
            .iter()
            .map(|(k, &li)| ((k >> 32) as u32, k as u32, li))
            .collect();
        v.sort_unstable();
        v
    }

    fn push_chunk(&mut self, c: Chunk) -> u32 {
        self.chunks.push(c);
        self.chunks.len() as u32 - 1
    }

    /// The translation block of (service, chunk), created if absent; one more
    /// reference to it.
    fn block_ref(&mut self, svc: ServiceId, c: u32) -> u32 {
        let key = ((svc as u64) << 32) | c as u64;
        let b = match self.block_map.get(key) {
            Some(&b) => b,
            None => {
                let b = match self.free_blocks.pop() {
                    Some(b) => b,
                    None => {
                        self.blocks.push(Block([NONE; 512]));
                        self.block_refs.push(0);
                        self.blocks.len() as u32 - 1
                    }
                };
                self.block_map.insert(key, b);
                b
            }
        };
        self.block_refs[b as usize] += 1;
        b
    }

    fn block_unref(&mut self, svc: ServiceId, c: u32) {
        let key = ((svc as u64) << 32) | c as u64;
        if let Some(&b) = self.block_map.get(key) {
            self.block_refs[b as usize] -= 1;
            if self.block_refs[b as usize] == 0 {
                self.block_map.remove(key);
                self.blocks[b as usize] = Block([NONE; 512]);
                self.free_blocks.push(b);
            }
        }
    }

    fn block_of(&self, svc: ServiceId, c: u32) -> u32 {
        self.block_map
            .get(((svc as u64) << 32) | c as u64)
            .copied()
            .unwrap_or(NONE)
    }

    fn expand(&self, dst: ServiceId, e: &PermEntry) -> PermissionView {
        let mut procs = Vec::new();
        let mut doms = Vec::new();
        let chunks_of = |kind: u64, c0: u32, ovf: bool| -> Vec<(u32, u32)> {
            let mut v = Vec::new();
            if c0 != NONE {
                v.push((0, c0));
            }
            if ovf {
                for (k, &ci) in self.chunk_map.iter() {
                    if k & kind != 0 && ((k >> 24) & 0xff_ffff) as u32 == e.id {
                        v.push(((k & 0xff_ffff) as u32, ci));
                    }
                }
            }
            v.sort_unstable();
            v
        };
        for (c, ci) in chunks_of(KIND_PROC, e.proc_chunk0, e.flags & FLAG_PROC_OVF != 0) {
            let ch = &self.chunks[ci as usize];
            let blk = self.block_of(dst, c);
            for b in 0..CHUNK_BITS {
                if ch.test(b) {
                    let a = self.blocks[blk as usize].0[b as usize];
                    procs.push((c * CHUNK_BITS + b, Address(a)));
                }
            }
        }
        for (c, ci) in chunks_of(KIND_DOM, e.dom_chunk0, e.flags & FLAG_DOM_OVF != 0) {
            let ch = &self.chunks[ci as usize];
            for b in 0..CHUNK_BITS {
                if ch.test(b) {
                    doms.push(c * CHUNK_BITS + b);
                }
            }
        }
        let rate = (e.rate_slot != NONE).then_some(e.rate_slot);
        (procs, doms, rate)
    }

    fn drop_entry(&mut self, key: u64) {
        let Some(e) = self.perm.remove(key) else {
            return;
        };
        let dst = key as u32;
        let mut n_chunks = 0;
        if e.proc_chunk0 != NONE {
            n_chunks += 1;
            self.block_unref(dst, 0);
        }
        if e.dom_chunk0 != NONE {
            n_chunks += 1;
        }
        if e.flags & (FLAG_PROC_OVF | FLAG_DOM_OVF) != 0 {
            let gone: Vec<u64> = self
                .chunk_map
                .iter()
                .filter(|(k, _)| ((k >> 24) & 0xff_ffff) as u32 == e.id)
                .map(|(k, _)| k)
                .collect();
            for k in gone {
                self.chunk_map.remove(k);
                n_chunks += 1;
                if k & KIND_PROC != 0 {
                    self.block_unref(dst, (k & 0xff_ffff) as u32);
                }
            }
        }
        self.garbage += n_chunks;
    }

    fn maybe_compact(&mut self) {
        if self.garbage > 64 && self.garbage * 2 > self.chunks.len() {
            self.compact();
        }
    }

    /// Rewrites the chunk array without the chunks of replaced or removed entries
    /// (off the critical path, like the NMU's allocator, §6.1.2).
    pub fn compact(&mut self) {
        let entries: Vec<(u64, PermEntry)> = self.perm.iter().map(|(k, e)| (k, *e)).collect();
        let expanded: Vec<(u64, _)> = entries
            .iter()
            .map(|(k, e)| (*k, self.expand(*k as u32, e)))
            .collect();
        self.perm = FlatMap::with_capacity(entries.len());
        self.chunks = Vec::with_capacity(self.chunks.len() - self.garbage.min(self.chunks.len()));
        self.chunk_map = FlatMap::default();
        self.blocks.clear();
        self.block_refs.clear();
        self.block_map = FlatMap::default();
        self.free_blocks.clear();
        self.garbage = 0;
        self.next_perm_id = 0;
        for (k, (procs, doms, rate)) in expanded {
            let g = (k >> 32) as u32;
            let src = self.groups[g as usize].svc;
            let _ = self.set_permission(src, k as u32, &procs, &doms, rate);
        }
    }

    /// Sizes of the tables.
    pub fn stats(&self) -> TableStats {
        let mut s = TableStats {
            processes: self.index.len(),
            services: self.group_of.len(),
            sacl_entries: self.perm.len(),
            ..Default::default()
        };
        for (k, e) in self.perm.iter() {
            let (p, d, _) = if e.flags & (FLAG_PROC_OVF | FLAG_DOM_OVF) == 0 {
                let p = if e.proc_chunk0 != NONE {
                    self.chunks[e.proc_chunk0 as usize].ones() as usize
                } else {
                    0
                };
                let d = if e.dom_chunk0 != NONE {
                    self.chunks[e.dom_chunk0 as usize].ones() as usize
                } else {
                    0
                };
                (p, d, ())
            } else {
                let (p, d, _) = self.expand(k as u32, e);
                (p.len(), d.len(), ())
            };
            s.process_entries += p;
            s.domain_entries += d;
        }
        s.perm_bytes = self.perm.memory_bytes();
        s.chunk_bytes =
            self.chunks.len() * std::mem::size_of::<Chunk>() + self.chunk_map.memory_bytes();
        s.addr_bytes = self.blocks.len() * std::mem::size_of::<Block>()
            + self.block_refs.len() * 4
            + self.block_map.memory_bytes();
        s.other_bytes = self.index.memory_bytes()
            + self.group_of.memory_bytes()
            + self.groups.len() * std::mem::size_of::<SvcGroup>()
            + self
                .info
                .iter()
                .map(|i| {
                    std::mem::size_of::<Info>()
                        + i.otps.memory_bytes()
                        + i.peers.len() * std::mem::size_of::<Address>()
                })
                .sum::<usize>();
        s.total_bytes = s.perm_bytes + s.chunk_bytes + s.addr_bytes + s.other_bytes;
        s
    }

    /// Address ranges of the large arrays (for huge-page advice by the caller).
    pub fn regions(&self) -> Vec<(*const u8, usize)> {
        vec![
            self.perm.region(),
            (
                self.chunks.as_ptr() as *const u8,
                self.chunks.len() * std::mem::size_of::<Chunk>(),
            ),
            (
                self.blocks.as_ptr() as *const u8,
                self.blocks.len() * std::mem::size_of::<Block>(),
            ),
        ]
    }

    // ---------------------------------------------------------------- fast path

    /// The permission check of §6.2.1 for a resident process `li` sending to `dst`:
    /// InfoMap → PermissionMap[RemoteService] → ProcessMap[RemoteProcess] (Address)
    /// and DomainSet[RemoteDomain]. Returns the address and rate slot.
    #[inline]
    pub fn check(&self, li: LocalIndex, dst: Triple) -> Result<(Address, Option<u32>), NmuError> {
        let info = match self.info.get(li as usize) {
            Some(i) if i.live => i,
            _ => return Err(NmuError::UnknownLocalIndex(li)),
        };
        self.check_group(info.svc_slot, info.svc, dst)
    }

    #[inline(always)]
    fn check_group(
        &self,
        g: u32,
        src: ServiceId,
        dst: Triple,
    ) -> Result<(Address, Option<u32>), NmuError> {
        let Some(e) = self.perm.get(perm_key(g, dst.svc)) else {
            return Err(NmuError::ServiceDenied { src, dst: dst.svc });
        };
        let pc = self.chunk_index(e.proc_chunk0, e, KIND_PROC, FLAG_PROC_OVF, dst.proc);
        let dc = self.chunk_index(e.dom_chunk0, e, KIND_DOM, FLAG_DOM_OVF, dst.dom);
        let pb = dst.proc % CHUNK_BITS;
        // The address load does not depend on the membership test: issue it first so
        // that it overlaps with the two chunk loads.
        let blk0 = e.addr_block0;
        let early = if dst.proc < CHUNK_BITS && blk0 != NONE {
            self.blocks[blk0 as usize].0[pb as usize]
        } else {
            NONE
        };
        let proc_ok = pc != NONE && self.chunks[pc as usize].test(pb);
        let dom_ok = dc != NONE && self.chunks[dc as usize].test(dst.dom % CHUNK_BITS);
        if !proc_ok {
            return Err(NmuError::ProcessDenied {
                src,
                dst: dst.svc,
                proc: dst.proc,
            });
        }
        if !dom_ok {
            return Err(NmuError::DomainDenied {
                src,
                dst: dst.svc,
                dom: dst.dom,
            });
        }
        let addr = if dst.proc < CHUNK_BITS {
            early
        } else {
            let blk = self.block_of(dst.svc, dst.proc / CHUNK_BITS);
            self.blocks[blk as usize].0[pb as usize]
        };
        let rate = (e.rate_slot != NONE).then_some(e.rate_slot);
        Ok((Address(addr), rate))
    }

    #[inline(always)]
    fn chunk_index(&self, c0: u32, e: &PermEntry, kind: u64, flag: u32, id: u32) -> u32 {
        if id < CHUNK_BITS {
            c0
        } else if e.flags & flag != 0 {
            self.chunk_map
                .get(chunk_key(kind, e.id, id / CHUNK_BITS))
                .copied()
                .unwrap_or(NONE)
        } else {
            NONE
        }
    }

    /// Send (§6.2.1): check, translate, and build the header with the derived source.
    pub fn send(&self, li: LocalIndex, dst: Triple) -> Result<Outgoing, NmuError> {
        let (address, rate_slot) = self.check(li, dst)?;
        let i = &self.info[li as usize];
        Ok(Outgoing {
            address,
            header: Header {
                src: (i.svc, i.proc),
                dst,
                otp: None,
            },
            rate_slot,
        })
    }

    /// Send with OTP (§6.2.3): two checks, one for the responder and one for the
    /// recipient (an OTP can only be made from permissions the requester holds).
    /// The request itself is rate-controlled like any send.
    pub fn send_with_otp(
        &self,
        li: LocalIndex,
        responder: Triple,
        recipient: Triple,
    ) -> Result<Outgoing, NmuError> {
        let (address, rate_slot) = self.check(li, responder)?;
        let (raddr, _) = self.check(li, recipient)?;
        let i = &self.info[li as usize];
        Ok(Outgoing {
            address,
            header: Header {
                src: (i.svc, i.proc),
                dst: responder,
                otp: Some(OtpBlock {
                    recipient,
                    recipient_addr: raddr,
                    requester: None,
                }),
            },
            rate_slot,
        })
    }

    /// Receive (§6.2.2): IndexMap[(LocalService, LocalProcess)] → LocalIndex.
    pub fn receive(&self, h: &Header) -> Result<LocalIndex, NmuError> {
        self.index
            .get(perm_key(h.dst.svc, h.dst.proc))
            .copied()
            .ok_or(NmuError::NotResident(h.dst.svc, h.dst.proc))
    }

    /// Receive with OTP (§6.2.4): deliver with `OtpNextKey`, store the OTP under it,
    /// advance the key. The OTP lives until `now + otp_ttl`.
    pub fn receive_with_otp(
        &mut self,
        h: &Header,
        now: u64,
    ) -> Result<(LocalIndex, OtpKey), NmuError> {
        let otp = h.otp.ok_or(NmuError::NoOtpInMessage)?;
        let li = self.receive(h)?;
        let cap = self.cfg.otp_cap;
        let ttl = self.cfg.otp_ttl;
        let info = &mut self.info[li as usize];
        if info.otps.len() >= cap {
            info.otps.retain(|_, e| e.expires > now);
            if info.otps.len() >= cap {
                return Err(NmuError::OtpTableFull {
                    svc: info.svc,
                    proc: info.proc,
                    cap,
                });
            }
        }
        // Skip keys still in use (possible only after the 32-bit key wraps).
        let mut key = info.otp_next;
        while info.otps.contains(key as u64) {
            key = key.wrapping_add(1);
        }
        info.otp_next = key.wrapping_add(1);
        info.otps.insert(
            key as u64,
            OtpEntry {
                recipient: Triple0 {
                    svc: otp.recipient.svc,
                    proc: otp.recipient.proc,
                    dom: otp.recipient.dom,
                },
                recipient_addr: otp.recipient_addr.0,
                requester: h.src,
                expires: now.saturating_add(ttl),
            },
        );
        Ok((li, key))
    }

    /// Send using OTP (§6.2.5): remove OtpMap[OtpKey] (so it can never be used again),
    /// send to the recipient and name the requester. No permission check is made and
    /// the message bypasses rate control (§6.2.6, read as "sent *using* an OTP";
    /// erratum 6).
    pub fn send_using_otp(
        &mut self,
        li: LocalIndex,
        key: OtpKey,
        now: u64,
    ) -> Result<Outgoing, NmuError> {
        let info = match self.info.get_mut(li as usize) {
            Some(i) if i.live => i,
            _ => return Err(NmuError::UnknownLocalIndex(li)),
        };
        let e = info
            .otps
            .remove(key as u64)
            .ok_or(NmuError::UnknownOtp(key))?;
        if e.expires <= now {
            return Err(NmuError::OtpExpired(key));
        }
        let recipient = Triple::new(e.recipient.svc, e.recipient.proc, e.recipient.dom);
        Ok(Outgoing {
            address: Address(e.recipient_addr),
            header: Header {
                src: (info.svc, info.proc),
                dst: recipient,
                otp: Some(OtpBlock {
                    recipient,
                    recipient_addr: Address(e.recipient_addr),
                    requester: Some(e.requester),
                }),
            },
            rate_slot: None,
        })
    }

    /// Live OTPs of a process.
    pub fn otp_count(&self, li: LocalIndex) -> usize {
        self.info
            .get(li as usize)
            .map(|i| i.otps.len())
            .unwrap_or(0)
    }

    /// Drops every expired OTP; returns how many.
    pub fn purge_expired(&mut self, now: u64) -> usize {
        let mut n = 0;
        for i in &mut self.info {
            let before = i.otps.len();
            i.otps.retain(|_, e| e.expires > now);
            n += before - i.otps.len();
        }
        n
    }
}

#[cfg(test)]
mod tests;
