//! The cost model: instruction classes, their calibrated cycle costs, the memory-latency
//! table by working-set size (thesis Tables 3.1 and 5.1), and host-call costs.
//!
//! CAT charged register-only instructions ~1 cycle, memory references the mbench latency
//! for the extension's working set, and calls the callee's bound (§4.3.1). sidecore does
//! the same on Wasm operators, with every class cost measured on the deployment machine
//! by `sidecore calibrate` (crate `sidecore-ext`) and loaded from its JSON file.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use wasmparser::Operator;

/// Instruction classes the cost model prices separately.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpClass {
    /// Structural operators that compile to nothing (`block`, `loop`, `end`, `nop`, `drop`).
    Free,
    /// Moves: locals, globals, constants, `select`.
    Move,
    /// Integer add/sub/logic/shift/compare/convert.
    Alu,
    /// Integer multiply.
    Mul,
    /// Integer divide and remainder.
    Div,
    /// Floating-point add/sub/mul/compare/convert.
    Float,
    /// Floating-point divide and square root.
    FloatDiv,
    /// Linear-memory load.
    Load,
    /// Linear-memory store.
    Store,
    /// `br`, `br_if`, `br_table`, `if`, `else`, `return`.
    Branch,
    /// A direct call to a function of the module (overhead only; the callee's bound is added).
    Call,
    /// An indirect call through a table (overhead only).
    CallIndirect,
    /// `memory.size`.
    MemSize,
    /// One byte of `memory.copy` / `memory.fill`.
    BulkByte,
}

impl OpClass {
    pub const ALL: &'static [OpClass] = &[
        OpClass::Free,
        OpClass::Move,
        OpClass::Alu,
        OpClass::Mul,
        OpClass::Div,
        OpClass::Float,
        OpClass::FloatDiv,
        OpClass::Load,
        OpClass::Store,
        OpClass::Branch,
        OpClass::Call,
        OpClass::CallIndirect,
        OpClass::MemSize,
        OpClass::BulkByte,
    ];
}

/// The class of an operator, or `None` if sidecore does not admit it at all.
pub fn classify(op: &Operator<'_>) -> Option<OpClass> {
    use Operator::*;
    Some(match op {
        Nop | Drop | Block { .. } | Loop { .. } | End | Unreachable => OpClass::Free,
        LocalGet { .. }
        | LocalSet { .. }
        | LocalTee { .. }
        | GlobalGet { .. }
        | GlobalSet { .. }
        | I32Const { .. }
        | I64Const { .. }
        | F32Const { .. }
        | F64Const { .. }
        | Select
        | TypedSelect { .. }
        | RefNull { .. }
        | RefIsNull
        | RefFunc { .. } => OpClass::Move,
        I32Mul | I64Mul => OpClass::Mul,
        I32DivS | I32DivU | I32RemS | I32RemU | I64DivS | I64DivU | I64RemS | I64RemU => {
            OpClass::Div
        }
        F32Div | F64Div | F32Sqrt | F64Sqrt => OpClass::FloatDiv,
        I32Load { .. }
        | I64Load { .. }
        | F32Load { .. }
        | F64Load { .. }
        | I32Load8S { .. }
        | I32Load8U { .. }
        | I32Load16S { .. }
        | I32Load16U { .. }
        | I64Load8S { .. }
        | I64Load8U { .. }
        | I64Load16S { .. }
        | I64Load16U { .. }
        | I64Load32S { .. }
        | I64Load32U { .. } => OpClass::Load,
        I32Store { .. }
        | I64Store { .. }
        | F32Store { .. }
        | F64Store { .. }
        | I32Store8 { .. }
        | I32Store16 { .. }
        | I64Store8 { .. }
        | I64Store16 { .. }
        | I64Store32 { .. } => OpClass::Store,
        Br { .. } | BrIf { .. } | BrTable { .. } | If { .. } | Else | Return => OpClass::Branch,
        Call { .. } => OpClass::Call,
        CallIndirect { .. } => OpClass::CallIndirect,
        MemorySize { .. } => OpClass::MemSize,
        MemoryCopy { .. } | MemoryFill { .. } => OpClass::BulkByte,
        I32Eqz | I32Eq | I32Ne | I32LtS | I32LtU | I32GtS | I32GtU | I32LeS | I32LeU | I32GeS
        | I32GeU | I64Eqz | I64Eq | I64Ne | I64LtS | I64LtU | I64GtS | I64GtU | I64LeS | I64LeU
        | I64GeS | I64GeU | I32Clz | I32Ctz | I32Popcnt | I32Add | I32Sub | I32And | I32Or
        | I32Xor | I32Shl | I32ShrS | I32ShrU | I32Rotl | I32Rotr | I64Clz | I64Ctz | I64Popcnt
        | I64Add | I64Sub | I64And | I64Or | I64Xor | I64Shl | I64ShrS | I64ShrU | I64Rotl
        | I64Rotr | I32WrapI64 | I64ExtendI32S | I64ExtendI32U | I32Extend8S | I32Extend16S
        | I64Extend8S | I64Extend16S | I64Extend32S | I32ReinterpretF32 | I64ReinterpretF64
        | F32ReinterpretI32 | F64ReinterpretI64 => OpClass::Alu,
        F32Eq | F32Ne | F32Lt | F32Gt | F32Le | F32Ge | F64Eq | F64Ne | F64Lt | F64Gt | F64Le
        | F64Ge | F32Abs | F32Neg | F32Ceil | F32Floor | F32Trunc | F32Nearest | F32Add
        | F32Sub | F32Mul | F32Min | F32Max | F32Copysign | F64Abs | F64Neg | F64Ceil
        | F64Floor | F64Trunc | F64Nearest | F64Add | F64Sub | F64Mul | F64Min | F64Max
        | F64Copysign | I32TruncF32S | I32TruncF32U | I32TruncF64S | I32TruncF64U
        | I64TruncF32S | I64TruncF32U | I64TruncF64S | I64TruncF64U | F32ConvertI32S
        | F32ConvertI32U | F32ConvertI64S | F32ConvertI64U | F32DemoteF64 | F64ConvertI32S
        | F64ConvertI32U | F64ConvertI64S | F64ConvertI64U | F64PromoteF32 | I32TruncSatF32S
        | I32TruncSatF32U | I32TruncSatF64S | I32TruncSatF64U | I64TruncSatF32S
        | I64TruncSatF32U | I64TruncSatF64S | I64TruncSatF64U => OpClass::Float,
        _ => return None,
    })
}

/// wasmtime's fuel price of an operator: 0 for the structural ones, 1 for the rest
/// (wasmtime `fuel` docs). Used for the machine-independent operator bound, which must
/// never be below the fuel a run consumes.
pub fn fuel_units(op: &Operator<'_>) -> f64 {
    use Operator::*;
    match op {
        Nop | Drop | Block { .. } | Loop { .. } | Unreachable | Return | Else | End => 0.0,
        _ => 1.0,
    }
}

/// One row of the memory-latency table: average cycles per strided access when the
/// working set is `ws_bytes` (mbench, thesis Fig. 3.2 / Table 5.1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyRow {
    pub ws_bytes: u64,
    pub read_cycles: f64,
    pub write_cycles: f64,
    /// Dependent (pointer-chasing) read latency, as in Table 3.1 (informational).
    pub chase_cycles: f64,
}

/// A host import's price: `base + per_byte * bytes`, where bytes is bounded by a
/// constant argument or by the region cap `max_bytes`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HostCost {
    pub base_cycles: f64,
    pub per_byte_cycles: f64,
    /// Which argument (0-based) carries the byte count, if the cost depends on one.
    pub len_arg: Option<u32>,
    /// The most bytes one call can move (the region cap).
    pub max_bytes: u64,
}

/// Calibrated per-machine costs, as written by `sidecore calibrate`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Where these figures come from (host name, CPU model, date).
    pub machine: String,
    /// TSC ticks per nanosecond.
    pub tsc_per_ns: f64,
    /// Cycles per operator of each class (register-resident operands).
    pub class_cycles: BTreeMap<OpClass, f64>,
    /// Fixed cost of one invocation: host → guest entry and return, with accounting.
    pub invoke_cycles: f64,
    /// Memory latency by working-set size, ascending.
    pub latency: Vec<LatencyRow>,
    /// Base cost of each host import (by `module.name`), cycles.
    pub host_base_cycles: BTreeMap<String, f64>,
    /// Cost per byte copied across the host boundary.
    pub host_per_byte_cycles: f64,
}

impl Calibration {
    /// Conservative figures for when no calibration file exists (documented as such in
    /// every report that uses them). They are in the range `sidecore calibrate` measures
    /// on a current x86-64 core, rounded up.
    pub fn fallback() -> Self {
        let mut class_cycles = BTreeMap::new();
        for (c, v) in [
            (OpClass::Free, 0.0),
            (OpClass::Move, 0.3),
            (OpClass::Alu, 1.0),
            (OpClass::Mul, 3.0),
            (OpClass::Div, 25.0),
            (OpClass::Float, 4.0),
            (OpClass::FloatDiv, 15.0),
            (OpClass::Load, 1.0),
            (OpClass::Store, 1.0),
            (OpClass::Branch, 1.0),
            (OpClass::Call, 5.0),
            (OpClass::CallIndirect, 10.0),
            (OpClass::MemSize, 2.0),
            (OpClass::BulkByte, 0.25),
        ] {
            class_cycles.insert(c, v);
        }
        Calibration {
            machine: "fallback (uncalibrated)".into(),
            tsc_per_ns: 2.0,
            class_cycles,
            invoke_cycles: 150.0,
            latency: vec![
                LatencyRow {
                    ws_bytes: 32 << 10,
                    read_cycles: 1.0,
                    write_cycles: 1.0,
                    chase_cycles: 5.0,
                },
                LatencyRow {
                    ws_bytes: 256 << 10,
                    read_cycles: 3.0,
                    write_cycles: 3.0,
                    chase_cycles: 14.0,
                },
                LatencyRow {
                    ws_bytes: 8 << 20,
                    read_cycles: 10.0,
                    write_cycles: 12.0,
                    chase_cycles: 50.0,
                },
                LatencyRow {
                    ws_bytes: 1 << 30,
                    read_cycles: 40.0,
                    write_cycles: 50.0,
                    chase_cycles: 250.0,
                },
            ],
            host_base_cycles: BTreeMap::new(),
            host_per_byte_cycles: 0.5,
        }
    }

    /// The row covering a working set of `ws` bytes (the first row at least that large).
    pub fn latency_for(&self, ws: u64) -> Option<LatencyRow> {
        self.latency
            .iter()
            .find(|r| r.ws_bytes >= ws)
            .or_else(|| self.latency.last())
            .copied()
    }
}

/// Weights the analysis charges: cycles (from a calibration) or fuel units.
#[derive(Debug, Clone, PartialEq)]
pub struct CostModel {
    pub class: BTreeMap<OpClass, f64>,
    pub invoke: f64,
    pub host: BTreeMap<String, HostCost>,
    /// Cost charged for a host import not in `host` (never happens for admitted modules).
    pub unknown_host: f64,
    /// Whether this model counts fuel units instead of cycles.
    pub fuel: bool,
}

impl CostModel {
    /// Cycle model: class costs from the calibration, loads and stores priced at the
    /// latency table's row for `working_set` bytes (never below the class cost).
    pub fn cycles(cal: &Calibration, working_set: u64, host: BTreeMap<String, HostCost>) -> Self {
        let mut class = cal.class_cycles.clone();
        for c in OpClass::ALL {
            class.entry(*c).or_insert(1.0);
        }
        if let Some(row) = cal.latency_for(working_set) {
            let l = class.get(&OpClass::Load).copied().unwrap_or(1.0);
            let s = class.get(&OpClass::Store).copied().unwrap_or(1.0);
            class.insert(OpClass::Load, l.max(row.read_cycles));
            class.insert(OpClass::Store, s.max(row.write_cycles));
        }
        CostModel {
            class,
            invoke: cal.invoke_cycles,
            host,
            unknown_host: 1e6,
            fuel: false,
        }
    }

    /// Fuel model: one unit per operator (structural ones free), host calls one unit.
    pub fn fuel() -> Self {
        CostModel {
            class: BTreeMap::new(),
            invoke: 0.0,
            host: BTreeMap::new(),
            unknown_host: 1.0,
            fuel: true,
        }
    }

    pub fn op(&self, op: &Operator<'_>, class: OpClass) -> f64 {
        if self.fuel {
            fuel_units(op)
        } else {
            self.class.get(&class).copied().unwrap_or(1.0)
        }
    }

    /// Cost of a call to host import `name`; `const_len` is the byte count if it was a
    /// constant in the bytecode.
    pub fn host_call(&self, name: &str, const_len: Option<u64>) -> f64 {
        if self.fuel {
            return 1.0;
        }
        match self.host.get(name) {
            Some(h) => {
                let bytes = match (h.len_arg, const_len) {
                    (Some(_), Some(c)) => c.min(h.max_bytes),
                    (Some(_), None) => h.max_bytes,
                    (None, _) => 0,
                };
                h.base_cycles + h.per_byte_cycles * bytes as f64
            }
            None => self.unknown_host,
        }
    }
}
