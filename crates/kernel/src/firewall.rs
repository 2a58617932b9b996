//! SCIRON at XDP: loads `bpf/firewall.bpf.c`, writes a compiled rule set's
//! tuple-space tables into its maps, attaches it to an interface (in a network
//! namespace if asked), and reads back its counters and log.
//!
//! Rule updates are live: the tables come in two generations, the idle one is
//! filled, and one write of `fw_config` flips the program to it. Entries of
//! the generation being replaced are deleted at the next update, once no
//! packet can still be looking at them.

use std::collections::HashMap as StdHashMap;

use aya::Ebpf;
use aya::maps::{Array, HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::Xdp;
use aya::programs::xdp::XdpLinkId;
use sidecore_firewall::{Action, Classifier};

use crate::error::{KernelError, XdpMode, chain, refused};
use crate::objects;

/// The XDP program's name in the object.
pub const PROGRAM: &str = "sidecore_fw";
/// Shapes the program probes per generation (`FW_MAX_SHAPES`).
pub const MAX_SHAPES: usize = 64;

// The map layouts of bpf/firewall.bpf.c, field for field.

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
struct FwKey {
    src: u32,
    dst: u32,
    sport: u16,
    dport: u16,
    proto: u8,
    shape: u8,
    gen_: u8,
    pad: u8,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwVal {
    rule: u32,
    action: u8,
    log: u8,
    pad: u16,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwShape {
    src_mask: u32,
    dst_mask: u32,
    sport_mask: u16,
    dport_mask: u16,
    proto_mask: u8,
    pad: [u8; 3],
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct FwConfig {
    gen_: u32,
    shapes: [u32; 2],
}

/// One log record from the ring buffer, as `bpf/firewall.bpf.c` writes it.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogEvent {
    pub rule: u32,
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
    /// 1 accept, 0 deny.
    pub action: u8,
    pub len: u16,
}

// SAFETY: plain `repr(C)` structs of integers with no padding the kernel could
// leave uninitialised (every field is written, `pad` fields included), valid
// for any bit pattern.
unsafe impl aya::Pod for FwKey {}
// SAFETY: as above.
unsafe impl aya::Pod for FwVal {}
// SAFETY: as above.
unsafe impl aya::Pod for FwShape {}
// SAFETY: as above.
unsafe impl aya::Pod for FwConfig {}

impl LogEvent {
    /// Reads a record; `None` if the bytes are not one.
    pub fn from_bytes(b: &[u8]) -> Option<LogEvent> {
        if b.len() < std::mem::size_of::<LogEvent>() {
            return None;
        }
        let u32_at = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u16_at = |i: usize| u16::from_ne_bytes([b[i], b[i + 1]]);
        Some(LogEvent {
            rule: u32_at(0),
            src: u32_at(4),
            dst: u32_at(8),
            sport: u16_at(12),
            dport: u16_at(14),
            proto: b[16],
            action: b[17],
            len: u16_at(18),
        })
    }
}

/// The program's counters, summed over CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FwStats {
    pub accepted: u64,
    pub denied: u64,
    pub default_denied: u64,
    pub not_ipv4: u64,
    pub log_lost: u64,
    pub malformed: u64,
}

impl FwStats {
    /// Packets the rules (or the default) dropped.
    pub fn dropped(&self) -> u64 {
        self.denied + self.default_denied + self.malformed
    }
}

/// Where the program is attached.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Attached {
    id_netns: Option<String>,
    iface: String,
    mode: XdpMode,
}

/// The XDP firewall: loaded, and attached where asked.
pub struct XdpFirewall {
    ebpf: Ebpf,
    log: RingBuf<MapData>,
    /// The generation the program uses now.
    active: u8,
    /// Keys written per generation, deleted before the generation is reused.
    keys: [Vec<FwKey>; 2],
    link: Option<(XdpLinkId, Attached)>,
}

fn map_err(map: &str) -> impl Fn(aya::maps::MapError) -> KernelError + '_ {
    move |e| KernelError::Map {
        map: map.to_string(),
        detail: chain(&e),
    }
}

impl XdpFirewall {
    /// Loads the object and its program into the kernel (the verifier runs
    /// here). Nothing is attached yet; every packet would be denied by default
    /// until [`install`](Self::install).
    pub fn load() -> Result<XdpFirewall, KernelError> {
        let mut ebpf = Ebpf::load(objects::firewall()).map_err(|e| KernelError::Load {
            object: "firewall".into(),
            detail: chain(&e),
        })?;
        let missing = |what, name: &str| KernelError::Missing {
            object: "firewall".into(),
            what,
            name: name.to_string(),
        };
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| missing("program", PROGRAM))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| KernelError::Verify {
                program: PROGRAM.into(),
                detail: chain(&e),
            })?;
        prog.load().map_err(|e| refused(PROGRAM, &e))?;
        let log = RingBuf::try_from(
            ebpf.take_map("fw_log")
                .ok_or_else(|| missing("map", "fw_log"))?,
        )
        .map_err(map_err("fw_log"))?;
        Ok(XdpFirewall {
            ebpf,
            log,
            active: 0,
            keys: [Vec::new(), Vec::new()],
            link: None,
        })
    }

    fn map<'a>(&'a mut self, name: &str) -> Result<&'a mut aya::maps::Map, KernelError> {
        self.ebpf.map_mut(name).ok_or_else(|| KernelError::Missing {
            object: "firewall".into(),
            what: "map",
            name: name.to_string(),
        })
    }

    /// Installs a compiled rule set: fills the idle generation, then flips the
    /// program to it. Packets in flight see the old rules or the new, never
    /// none.
    pub fn install(&mut self, c: &Classifier) -> Result<(), KernelError> {
        if c.shapes().len() > MAX_SHAPES {
            return Err(KernelError::TooManyShapes {
                shapes: c.shapes().len(),
                max: MAX_SHAPES,
            });
        }
        let idle = 1 - self.active;
        self.clear(idle)?;
        self.write_shapes(c, idle)?;
        self.write_entries(c, idle)?;
        self.flip(c, idle)
    }

    /// Deletes the entries of generation `g`.
    fn clear(&mut self, g: u8) -> Result<(), KernelError> {
        let keys = std::mem::take(&mut self.keys[usize::from(g)]);
        let mut rules: HashMap<_, FwKey, FwVal> =
            HashMap::try_from(self.map("fw_rules")?).map_err(map_err("fw_rules"))?;
        for k in &keys {
            match rules.remove(k) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err("fw_rules")(e)),
            }
        }
        Ok(())
    }

    fn write_shapes(&mut self, c: &Classifier, g: u8) -> Result<(), KernelError> {
        let mut shapes: Array<_, FwShape> =
            Array::try_from(self.map("fw_shapes")?).map_err(map_err("fw_shapes"))?;
        for (i, s) in c.shapes().iter().enumerate() {
            let (proto_mask, src_mask, sport_mask, dst_mask, dport_mask) = s.masks();
            let index =
                u32::try_from(usize::from(g) * MAX_SHAPES + i).expect("bounded by 2 * MAX_SHAPES");
            let shape = FwShape {
                src_mask,
                dst_mask,
                sport_mask,
                dport_mask,
                proto_mask,
                pad: [0; 3],
            };
            shapes.set(index, shape, 0).map_err(map_err("fw_shapes"))?;
        }
        Ok(())
    }

    fn write_entries(&mut self, c: &Classifier, g: u8) -> Result<(), KernelError> {
        let verdicts = c.verdicts().to_vec();
        let mut written = Vec::with_capacity(c.len());
        {
            let mut rules: HashMap<_, FwKey, FwVal> =
                HashMap::try_from(self.map("fw_rules")?).map_err(map_err("fw_rules"))?;
            for (shape, k, rule) in c.entries() {
                let key = FwKey {
                    src: k.src,
                    dst: k.dst,
                    sport: k.sport,
                    dport: k.dport,
                    proto: k.proto,
                    shape: u8::try_from(shape).expect("at most MAX_SHAPES shapes"),
                    gen_: g,
                    pad: 0,
                };
                let (action, log) = verdicts[rule as usize];
                let val = FwVal {
                    rule,
                    action: u8::from(action == Action::Accept),
                    log: u8::from(log),
                    pad: 0,
                };
                rules.insert(key, val, 0).map_err(map_err("fw_rules"))?;
                written.push(key);
            }
        }
        self.keys[usize::from(g)] = written;
        Ok(())
    }

    /// Publishes generation `g`: first its shape count, then (one more
    /// write) the switch, so a reader never pairs a generation with the
    /// other's count.
    fn flip(&mut self, c: &Classifier, g: u8) -> Result<(), KernelError> {
        let mut cfg: Array<_, FwConfig> =
            Array::try_from(self.map("fw_config")?).map_err(map_err("fw_config"))?;
        let mut now = cfg.get(&0, 0).map_err(map_err("fw_config"))?;
        now.shapes[usize::from(g)] = u32::try_from(c.shapes().len()).expect("at most MAX_SHAPES");
        cfg.set(0, now, 0).map_err(map_err("fw_config"))?;
        now.gen_ = u32::from(g);
        cfg.set(0, now, 0).map_err(map_err("fw_config"))?;
        self.active = g;
        Ok(())
    }

    /// Attaches at XDP to `iface` (in namespace `netns`). Attaching where it
    /// already is does nothing; attaching elsewhere moves it.
    pub fn attach(
        &mut self,
        netns: Option<&str>,
        iface: &str,
        mode: XdpMode,
    ) -> Result<(), KernelError> {
        let want = Attached {
            id_netns: netns.map(str::to_string),
            iface: iface.to_string(),
            mode,
        };
        if self.link.as_ref().is_some_and(|(_, at)| *at == want) {
            return Ok(());
        }
        self.detach();
        let prog: &mut Xdp = self
            .ebpf
            .program_mut(PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or_else(|| KernelError::Missing {
                object: "firewall".into(),
                what: "program",
                name: PROGRAM.into(),
            })?;
        let id =
            sidecore_testbed::within(netns, || prog.attach(iface, mode.aya()))?.map_err(|e| {
                KernelError::Attach {
                    program: PROGRAM.into(),
                    iface: iface.to_string(),
                    netns: netns.map(str::to_string),
                    detail: chain(&e),
                }
            })?;
        self.link = Some((id, want));
        Ok(())
    }

    /// Detaches, if attached.
    pub fn detach(&mut self) {
        let Some((id, _)) = self.link.take() else {
            return;
        };
        if let Some(prog) = self
            .ebpf
            .program_mut(PROGRAM)
            .and_then(|p| <&mut Xdp>::try_from(p).ok())
        {
            // The link is this process's; closing it cannot leave the
            // program attached, so an error here has nothing to undo.
            let _ = prog.detach(id);
        }
    }

    /// Whether it is attached, and where.
    pub fn attached(&self) -> Option<(Option<&str>, &str)> {
        self.link
            .as_ref()
            .map(|(_, a)| (a.id_netns.as_deref(), a.iface.as_str()))
    }

    /// The counters, summed over CPUs.
    pub fn stats(&mut self) -> Result<FwStats, KernelError> {
        let stats: PerCpuArray<_, u64> =
            PerCpuArray::try_from(self.map("fw_stats")?).map_err(map_err("fw_stats"))?;
        let mut v = [0u64; 6];
        for (i, slot) in v.iter_mut().enumerate() {
            let index = u32::try_from(i).expect("6 counters");
            *slot = stats
                .get(&index, 0)
                .map_err(map_err("fw_stats"))?
                .iter()
                .sum();
        }
        Ok(FwStats {
            accepted: v[0],
            denied: v[1],
            default_denied: v[2],
            not_ipv4: v[3],
            log_lost: v[4],
            malformed: v[5],
        })
    }

    /// Hands every waiting log record to `f`; returns how many.
    pub fn drain_log(&mut self, mut f: impl FnMut(LogEvent)) -> usize {
        let mut n = 0;
        while let Some(item) = self.log.next() {
            if let Some(e) = LogEvent::from_bytes(&item) {
                f(e);
                n += 1;
            }
        }
        n
    }

    /// Table entries per generation now (for tests and `ps`).
    pub fn entries(&self) -> usize {
        self.keys[usize::from(self.active)].len()
    }
}

impl Drop for XdpFirewall {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Rule hit counts from log events, by rule index (for tests and reports).
pub fn hits(events: &[LogEvent]) -> StdHashMap<u32, usize> {
    let mut m = StdHashMap::new();
    for e in events {
        *m.entry(e.rule).or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_the_c_structs() {
        assert_eq!(std::mem::size_of::<FwKey>(), 16);
        assert_eq!(std::mem::size_of::<FwVal>(), 8);
        assert_eq!(std::mem::size_of::<FwShape>(), 16);
        assert_eq!(std::mem::size_of::<FwConfig>(), 12);
        assert_eq!(std::mem::size_of::<LogEvent>(), 20);
        let e = LogEvent {
            rule: 7,
            src: 1,
            dst: 2,
            sport: 3,
            dport: 4,
            proto: 17,
            action: 1,
            len: 60,
        };
        // SAFETY: LogEvent is repr(C) plain integers with no padding.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                std::ptr::from_ref(&e).cast::<u8>(),
                std::mem::size_of::<LogEvent>(),
            )
        };
        assert_eq!(LogEvent::from_bytes(bytes), Some(e));
        assert_eq!(LogEvent::from_bytes(&bytes[..10]), None);
    }
}
