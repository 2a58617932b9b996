//! A user's own BPF object on the kernel PE: an ELF file compiled by the user
//! (clang `-target bpf`), loaded by aya, its programs attached where asked —
//! XDP on an interface, or tc (clsact ingress or egress; a TCX link on Linux
//! 6.6 and later) — and its maps exposed: ring buffers are drained to user
//! space record by record, array and hash maps are configuration written
//! from user space, and arrays of u64 are counters read back.
//!
//! Every error names the object's file; programs and maps that are not in the
//! object are named with the ones that are. Attachments are links owned by
//! this process (XDP links, TCX links), so a crash detaches them; on kernels
//! before 6.6 a tc program is attached through netlink and outlives a crash.

use std::os::fd::{AsFd, AsRawFd};
use std::path::{Path, PathBuf};

use aya::Ebpf;
use aya::maps::{Array, Map, MapData, PerCpuArray, RingBuf};
use aya::programs::tc::{SchedClassifierLinkId, TcAttachType};
use aya::programs::xdp::XdpLinkId;
use aya::programs::{Program, SchedClassifier};

use crate::error::{KernelError, XdpMode, chain, refused};

/// The first bytes of every ELF file.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// Largest object read.
pub const MAX_OBJECT_BYTES: u64 = 64 << 20;
/// Counter entries read from one array at most.
pub const MAX_COUNTERS: u32 = 256;

/// Where a program is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    /// XDP on an interface.
    Xdp { iface: String, mode: XdpMode },
    /// tc on an interface, ingress or egress.
    Tc { iface: String, egress: bool },
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hook::Xdp { iface, .. } => write!(f, "XDP on {iface}"),
            Hook::Tc { iface, egress } => write!(
                f,
                "tc {} on {iface}",
                if *egress { "egress" } else { "ingress" }
            ),
        }
    }
}

/// A link this object holds.
enum Link {
    Xdp(XdpLinkId),
    Tc(SchedClassifierLinkId),
}

/// Why a user's object could not be used: what, and which file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {source}", .path.display())]
pub struct ObjectError {
    pub path: PathBuf,
    #[source]
    pub source: KernelError,
}

/// A ring buffer map of a user's object, read from user space.
pub struct RingReader(RingBuf<MapData>);

impl RingReader {
    /// Hands up to `max` waiting records to `f`, oldest first; how many.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < max {
            let Some(item) = self.0.next() else { break };
            f(&item);
            n += 1;
        }
        n
    }
}

/// A user's BPF object, loaded.
pub struct UserObject {
    path: PathBuf,
    ebpf: Ebpf,
    links: Vec<(String, Link)>,
}

/// `a, b, c`, or `none`.
fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = names.collect();
    v.sort_unstable();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}

impl UserObject {
    /// Reads and loads the object: its maps are created here (the programs
    /// are verified when attached). An object that is not ELF, or not BPF,
    /// is refused with what it is.
    pub fn load(path: &Path) -> Result<UserObject, ObjectError> {
        let bytes = read_object(path)?;
        let ebpf = Ebpf::load(&bytes).map_err(|e| ObjectError {
            path: path.to_path_buf(),
            source: KernelError::Load {
                object: object_name(path),
                detail: chain(&e),
            },
        })?;
        Ok(UserObject {
            path: path.to_path_buf(),
            ebpf,
            links: Vec::new(),
        })
    }

    fn err(&self, source: KernelError) -> ObjectError {
        ObjectError {
            path: self.path.clone(),
            source,
        }
    }

    fn missing(&self, what: &'static str, name: &str, have: String) -> ObjectError {
        self.err(KernelError::Absent {
            object: object_name(&self.path),
            what,
            name: name.to_string(),
            have,
        })
    }

    /// The names of its programs.
    pub fn programs(&self) -> Vec<String> {
        self.ebpf.programs().map(|(n, _)| n.to_string()).collect()
    }

    /// The names of its maps.
    pub fn maps(&self) -> Vec<String> {
        self.ebpf.maps().map(|(n, _)| n.to_string()).collect()
    }

    /// Loads `program` (the verifier runs here; its refusal carries the tail
    /// of its log) and attaches it at `hook` inside `netns`.
    pub fn attach(
        &mut self,
        program: &str,
        netns: Option<&str>,
        hook: &Hook,
    ) -> Result<(), ObjectError> {
        let have = list(self.ebpf.programs().map(|(n, _)| n));
        let Some(prog) = self.ebpf.program_mut(program) else {
            return Err(self.missing("program", program, have));
        };
        match attach_program(prog, program, netns, hook) {
            Ok(link) => {
                self.links.push((program.to_string(), link));
                Ok(())
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// Detaches every program it attached. Idempotent.
    pub fn detach_all(&mut self) {
        for (name, link) in std::mem::take(&mut self.links) {
            // The links are this process's; closing one cannot leave the
            // program attached, so an error here has nothing to undo.
            match (self.ebpf.program_mut(&name), link) {
                (Some(Program::Xdp(x)), Link::Xdp(id)) => drop(x.detach(id)),
                (Some(Program::SchedClassifier(t)), Link::Tc(id)) => drop(t.detach(id)),
                _ => {}
            }
        }
    }

    /// How many programs are attached.
    pub fn attached(&self) -> usize {
        self.links.len()
    }

    /// Takes the ring buffer map `name`, to drain its records.
    pub fn take_ring(&mut self, name: &str) -> Result<RingReader, ObjectError> {
        let have = list(self.ebpf.maps().map(|(n, _)| n));
        let Some(map) = self.ebpf.take_map(name) else {
            return Err(self.missing("map", name, have));
        };
        RingBuf::try_from(map).map(RingReader).map_err(|e| {
            self.err(KernelError::Map {
                map: name.to_string(),
                detail: format!("not a ring buffer: {}", chain(&e)),
            })
        })
    }

    /// The key and value sizes of map `name`, if it is an array or a hash
    /// map (the maps that take configuration).
    pub fn config_map(&self, name: &str) -> Result<(usize, usize), ObjectError> {
        let data = self.config_data(name)?;
        let info = data.info().map_err(|e| self.map_err(name, &e))?;
        Ok((info.key_size() as usize, info.value_size() as usize))
    }

    fn config_data(&self, name: &str) -> Result<&MapData, ObjectError> {
        let have = list(self.ebpf.maps().map(|(n, _)| n));
        match self.ebpf.map(name) {
            None => Err(self.missing("map", name, have)),
            Some(Map::Array(d) | Map::HashMap(d) | Map::LruHashMap(d)) => Ok(d),
            Some(other) => Err(self.err(KernelError::Map {
                map: name.to_string(),
                detail: format!(
                    "a {} map takes no configuration (arrays and hash maps do)",
                    map_kind(other)
                ),
            })),
        }
    }

    fn map_err(&self, name: &str, e: &dyn std::error::Error) -> ObjectError {
        self.err(KernelError::Map {
            map: name.to_string(),
            detail: chain(e),
        })
    }

    /// Writes `value` at `key` of the array or hash map `name`; both must be
    /// exactly the map's key and value sizes.
    pub fn set(&self, name: &str, key: &[u8], value: &[u8]) -> Result<(), ObjectError> {
        let (key_size, value_size) = self.config_map(name)?;
        if key.len() != key_size || value.len() != value_size {
            return Err(self.err(KernelError::Map {
                map: name.to_string(),
                detail: format!(
                    "a {}-byte key and a {}-byte value given; the map takes {key_size} and {value_size}",
                    key.len(),
                    value.len()
                ),
            }));
        }
        let data = self.config_data(name)?;
        update_elem(data.fd().as_fd(), key, value).map_err(|e| {
            self.err(KernelError::Map {
                map: name.to_string(),
                detail: format!("update: {e}"),
            })
        })
    }

    /// Reads the u64 counters of the array or per-CPU array `name` (per-CPU
    /// values summed), index by index.
    pub fn counters(&self, name: &str) -> Result<Vec<u64>, ObjectError> {
        let have = list(self.ebpf.maps().map(|(n, _)| n));
        let map = self
            .ebpf
            .map(name)
            .ok_or_else(|| self.missing("map", name, have))?;
        let bad = |e: aya::maps::MapError| self.map_err(name, &e);
        match map {
            Map::Array(_) => {
                let a: Array<&MapData, u64> = Array::try_from(map).map_err(bad)?;
                (0..a.len().min(MAX_COUNTERS))
                    .map(|i| a.get(&i, 0).map_err(bad))
                    .collect()
            }
            Map::PerCpuArray(_) => {
                let a: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(map).map_err(bad)?;
                (0..a.len().min(MAX_COUNTERS))
                    .map(|i| a.get(&i, 0).map(|v| v.iter().sum()).map_err(bad))
                    .collect()
            }
            other => Err(self.err(KernelError::Map {
                map: name.to_string(),
                detail: format!(
                    "a {} map holds no counters (arrays of u64 do)",
                    map_kind(other)
                ),
            })),
        }
    }
}

/// The programs loaded in the kernel now (by anyone) whose names are in
/// `names`: to check that nothing of an object is left behind.
pub fn loaded_programs_named(names: &[&str]) -> Vec<String> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter_map(|p| p.name_as_str().map(str::to_string))
        .filter(|n| names.contains(&n.as_str()))
        .collect()
}

impl Drop for UserObject {
    fn drop(&mut self) {
        self.detach_all();
    }
}

/// The object's file name, for messages.
fn object_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// Reads an object, refusing what cannot be one before aya parses it.
fn read_object(path: &Path) -> Result<Vec<u8>, ObjectError> {
    let fail = |detail: String| ObjectError {
        path: path.to_path_buf(),
        source: KernelError::Load {
            object: object_name(path),
            detail,
        },
    };
    let meta = std::fs::metadata(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    if meta.len() > MAX_OBJECT_BYTES {
        return Err(fail(format!(
            "{} bytes, more than the {MAX_OBJECT_BYTES} a BPF object may have here",
            meta.len()
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| fail(format!("cannot read it: {e}")))?;
    if !bytes.starts_with(ELF_MAGIC) {
        let head: Vec<String> = bytes.iter().take(4).map(|b| format!("{b:02x}")).collect();
        return Err(fail(format!(
            "not an ELF object (it starts with {}; compile C with `clang -O2 -g -target bpf -c`)",
            if head.is_empty() {
                "nothing: it is empty".to_string()
            } else {
                head.join(" ")
            }
        )));
    }
    Ok(bytes)
}

/// Loads and attaches one program of the object.
fn attach_program(
    prog: &mut Program,
    program: &str,
    netns: Option<&str>,
    hook: &Hook,
) -> Result<Link, KernelError> {
    let attach_err = |detail: String| KernelError::Attach {
        program: program.to_string(),
        iface: hook.to_string(),
        netns: netns.map(str::to_string),
        detail,
    };
    match (prog, hook) {
        (Program::Xdp(x), Hook::Xdp { iface, mode }) => {
            load_once(x.fd().is_ok(), || x.load(), program)?;
            let r = sidecore_testbed::within(netns, || x.attach(iface, mode.aya()))?;
            Ok(Link::Xdp(r.map_err(|e| attach_err(chain(&e)))?))
        }
        (Program::SchedClassifier(t), Hook::Tc { iface, egress }) => {
            load_once(t.fd().is_ok(), || t.load(), program)?;
            let at = if *egress {
                TcAttachType::Egress
            } else {
                TcAttachType::Ingress
            };
            let r = sidecore_testbed::within(netns, || attach_tc(t, iface, at))?;
            Ok(Link::Tc(r.map_err(|e| attach_err(chain(&e)))?))
        }
        (p, _) => Err(attach_err(format!(
            "it is a {} program, which cannot attach there",
            kind_of(p)
        ))),
    }
}

/// Loads a program unless it is loaded already (attaching twice loads once).
fn load_once(
    loaded: bool,
    load: impl FnOnce() -> Result<(), aya::programs::ProgramError>,
    program: &str,
) -> Result<(), KernelError> {
    if loaded {
        return Ok(());
    }
    load().map_err(|e| refused(program, &e))
}

/// Attaches a tc program: a TCX link on Linux 6.6 and later (aya's
/// default), else through netlink on a clsact qdisc added first.
fn attach_tc(
    t: &mut SchedClassifier,
    iface: &str,
    at: TcAttachType,
) -> Result<SchedClassifierLinkId, aya::programs::ProgramError> {
    match t.attach(iface, at) {
        Ok(id) => Ok(id),
        Err(first) => {
            // Older kernels: netlink needs the clsact qdisc (adding it twice
            // is refused, which is fine). The first refusal is the one shown.
            let _ = aya::programs::tc::qdisc_add_clsact(iface);
            t.attach(iface, at).map_err(|_| first)
        }
    }
}

/// What kind of program it is, for messages.
fn kind_of(p: &Program) -> String {
    format!("{:?}", p.prog_type())
}

/// What kind of map it is, for messages: aya's variant name (`RingBuf`,
/// `PerCpuHashMap`, ...).
fn map_kind(m: &Map) -> String {
    let debug = format!("{m:?}");
    debug.split('(').next().unwrap_or("unknown").to_string()
}

/// `bpf(BPF_MAP_UPDATE_ELEM)` with raw key and value bytes: aya's typed maps
/// want sizes known at compile time, and a user's map has its own.
fn update_elem(fd: std::os::fd::BorrowedFd<'_>, key: &[u8], value: &[u8]) -> std::io::Result<()> {
    /// `union bpf_attr` as BPF_MAP_*_ELEM reads it.
    #[repr(C)]
    struct ElemAttr {
        map_fd: u32,
        _pad: u32,
        key: u64,
        value: u64,
        flags: u64,
    }
    const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
    const BPF_ANY: u64 = 0;
    let attr = ElemAttr {
        map_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        _pad: 0,
        key: key.as_ptr() as u64,
        value: value.as_ptr() as u64,
        flags: BPF_ANY,
    };
    // SAFETY: `attr` describes an open map and key/value buffers whose sizes
    // the caller checked against the map's; the kernel only reads them, and
    // all three live for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            std::ptr::from_ref(&attr),
            std::mem::size_of::<ElemAttr>(),
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_an_object_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("notes.bpf.o");
        std::fs::write(&p, "hello").unwrap();
        let e = UserObject::load(&p).err().unwrap().to_string();
        assert!(
            e.contains("notes.bpf.o")
                && e.contains("not an ELF object (it starts with 68 65 6c 6c"),
            "{e}"
        );
        std::fs::write(&p, "").unwrap();
        let e = UserObject::load(&p).err().unwrap().to_string();
        assert!(e.contains("it is empty"), "{e}");
        let e = UserObject::load(&dir.path().join("none.o"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("none.o") && e.contains("cannot read it"), "{e}");
    }
}
