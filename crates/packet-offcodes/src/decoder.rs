//! The `decoder` offcode (HYDRA's TiVoPC client, §8.1): a **stand-in for MPEG
//! decoding**, not a codec. Each chunk it receives is read as 8×8 blocks of
//! 16-bit coefficients and put through `rounds` passes of an integer,
//! separable 8-point inverse-DCT-like butterfly (rows, then columns), the
//! shape of work an MPEG decoder's IDCT does; a checksum of the output keeps
//! the work from being optimised away. Its point is to cost CPU per chunk on
//! whichever PE it lands on, so the client side's CPU (Table 8.4) can be
//! measured with it on the host and on a dedicated core.
//!
//! Parameters: `rounds` (1..=[`MAX_ROUNDS`], default 8). Metrics: `decoded`
//! (chunks), `bytes`, `checksum`, `cpu_ns` (the thread's CPU time since
//! start).

use serde::Deserialize;
use sidecore_offcode::{
    BuildSpec, InitCx, InputId, Metric, Offcode, OffcodeError, Progress, RunCx, parse_params,
};

use crate::util::{bad, thread_cpu_ns};

/// How long a host-placed decoder waits on a turn with nothing to decode.
const HOST_WAIT: std::time::Duration = std::time::Duration::from_millis(1);
/// Most rounds per chunk.
pub const MAX_ROUNDS: u32 = 10_000;

fn default_rounds() -> u32 {
    8
}

/// The decoder's parameters.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default = "default_rounds")]
    pub rounds: u32,
}

impl Params {
    /// Reads and checks the parameters.
    pub fn parse(t: &toml::Table) -> Result<Params, OffcodeError> {
        let p: Params = parse_params(t)?;
        if !(1..=MAX_ROUNDS).contains(&p.rounds) {
            return Err(bad(
                "rounds",
                format!("{} is outside 1..={MAX_ROUNDS}", p.rounds),
            ));
        }
        Ok(p)
    }
}

/// One 8-point integer butterfly in place (the even/odd split of a
/// fast IDCT, with fixed-point rotations; scaled down to stay bounded).
fn butterfly(v: &mut [i32; 8]) {
    let (a0, a1) = (v[0] + v[4], v[0] - v[4]);
    let (a2, a3) = (
        (v[2] * 1567 - v[6] * 3784) >> 12,
        (v[2] * 3784 + v[6] * 1567) >> 12,
    );
    let (e0, e1, e2, e3) = (a0 + a3, a1 + a2, a1 - a2, a0 - a3);
    let (b0, b1) = (
        (v[1] * 4017 + v[7] * 799) >> 12,
        (v[1] * 799 - v[7] * 4017) >> 12,
    );
    let (b2, b3) = (
        (v[3] * 2276 + v[5] * 3406) >> 12,
        (v[3] * 3406 - v[5] * 2276) >> 12,
    );
    let (o0, o1, o2, o3) = (b0 + b2, b1 + b3, b1 - b3, b0 - b2);
    *v = [
        (e0 + o0) >> 1,
        (e1 + o1) >> 1,
        (e2 + o2) >> 1,
        (e3 + o3) >> 1,
        (e3 - o3) >> 1,
        (e2 - o2) >> 1,
        (e1 - o1) >> 1,
        (e0 - o0) >> 1,
    ];
}

/// Decodes one chunk (`rounds` passes over each 8×8 block of 16-bit
/// coefficients; a short tail is zero-padded) and returns its checksum.
pub fn decode(chunk: &[u8], rounds: u32) -> u64 {
    let mut sum = 0u64;
    for block_bytes in chunk.chunks(128) {
        let mut b = [[0i32; 8]; 8];
        for (i, pair) in block_bytes.chunks(2).enumerate() {
            let lo = pair[0];
            let hi = pair.get(1).copied().unwrap_or(0);
            b[i / 8][i % 8] = i32::from(i16::from_le_bytes([lo, hi]));
        }
        let orig = b;
        for round in 0..rounds {
            for row in &mut b {
                butterfly(row);
            }
            for c in 0..8 {
                let mut col = [0i32; 8];
                for r in 0..8 {
                    col[r] = b[r][c];
                }
                butterfly(&mut col);
                for r in 0..8 {
                    // Scaled back and fed the coefficients again (with the
                    // round), so values stay bounded and every round counts.
                    b[r][c] = (col[r] >> 4) + orig[r][c] + round.cast_signed();
                }
            }
        }
        for row in &b {
            for &x in row {
                sum = (sum ^ u64::from(x.cast_unsigned())).wrapping_mul(0x0100_0000_01b3);
            }
        }
    }
    sum
}

/// The decoder.
pub struct Decoder {
    rounds: u32,
    cpu0: Option<u64>,
    /// On the host, a turn with nothing to decode waits [`HOST_WAIT`], as an
    /// ordinary decoder blocks on its input (instead of the executor's spin
    /// and yield).
    host: bool,
    busy: bool,
    m: [Metric; 4],
}

/// Builds a decoder.
pub fn build(spec: &BuildSpec<'_>) -> Result<Box<dyn Offcode>, OffcodeError> {
    Ok(Box::new(Decoder {
        rounds: Params::parse(spec.params)?.rounds,
        cpu0: None,
        host: spec.kind == sidecore_types::PeKind::Host,
        busy: false,
        m: Default::default(),
    }))
}

impl Offcode for Decoder {
    fn initialize(&mut self, cx: &mut InitCx<'_>) -> Result<(), OffcodeError> {
        cx.input("in")?;
        for (m, n) in self
            .m
            .iter_mut()
            .zip(["decoded", "bytes", "checksum", "cpu_ns"])
        {
            *m = cx.metric(n);
        }
        Ok(())
    }

    fn start(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.cpu0 = Some(thread_cpu_ns());
        Ok(())
    }

    fn handle(
        &mut self,
        _cx: &mut RunCx<'_>,
        _input: InputId,
        msg: &[u8],
    ) -> Result<(), OffcodeError> {
        self.busy = true;
        let c = decode(msg, self.rounds);
        self.m[0].add(1);
        self.m[1].add(msg.len() as u64);
        self.m[2].set(self.m[2].get() ^ c);
        if self.m[0].get() % 64 == 1 {
            self.account();
        }
        Ok(())
    }

    fn poll(&mut self, _cx: &mut RunCx<'_>) -> Result<Progress, OffcodeError> {
        if self.host && !self.busy {
            std::thread::sleep(HOST_WAIT);
        }
        self.busy = false;
        Ok(Progress::Idle)
    }

    fn stop(&mut self, _cx: &mut RunCx<'_>) -> Result<(), OffcodeError> {
        self.account();
        Ok(())
    }
}

impl Decoder {
    fn account(&self) {
        if let Some(c0) = self.cpu0 {
            self.m[3].set(thread_cpu_ns().saturating_sub(c0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoding_is_deterministic_and_costs_per_round() {
        let chunk: Vec<u8> = (0..1024u32).map(|i| (i * 7 % 256) as u8).collect();
        assert_eq!(decode(&chunk, 8), decode(&chunk, 8));
        assert_ne!(decode(&chunk, 8), decode(&chunk, 9));
        let mut other = chunk.clone();
        other[100] ^= 1;
        assert_ne!(decode(&chunk, 8), decode(&other, 8));
        // A short tail is padded, not refused.
        let _ = decode(&chunk[..1001], 1);
        let time = |r| {
            let t = std::time::Instant::now();
            for _ in 0..50 {
                std::hint::black_box(decode(std::hint::black_box(&chunk), r));
            }
            t.elapsed()
        };
        assert!(time(64) > time(1), "64 rounds cost more than one");
    }

    #[test]
    fn bad_parameters_are_named() {
        let t = |s: &str| -> toml::Table { toml::from_str(s).unwrap() };
        let e = Params::parse(&t("rounds = 0")).unwrap_err();
        assert!(e.to_string().contains("`rounds`: 0 is outside"), "{e}");
        let e = Params::parse(&t("rounds = 1\ncodec = \"mpeg2\"")).unwrap_err();
        assert!(e.to_string().contains("codec"), "{e}");
        assert_eq!(Params::parse(&t("")).unwrap().rounds, 8);
    }
}
