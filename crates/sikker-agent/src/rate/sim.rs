//! The agents' rate control on simulated time: `n` hosts `h0…`, each with one
//! process of the limited source service (process `i` on host `hi`), their
//! [`RateControl`]s joined by a network that takes one step per message.
//! Every active sender sends fixed-size messages as fast as its bucket
//! admits. Deterministic: the same calls give the same bytes. Used by the
//! unit tests and, beside the real agents, by the rate benchmark as the
//! prediction of what the code does with no CPU or network noise.

use std::collections::BTreeSet;

use sidecore_sikker_policy::Nos;
use sidecore_wire::Message;

use super::{Admit, RateControl};

/// The simulation.
pub struct Sim {
    pub(super) rc: Vec<Option<RateControl>>,
    pub(super) wire: Vec<(usize, Message)>,
    now: f64,
    step_ns: f64,
    size: usize,
    slot: u32,
}

fn idx(h: &str) -> usize {
    h.strip_prefix('h')
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

impl Sim {
    /// `n` hosts of `nos` (named `h0…`), all reaching each other, limit
    /// `slot`, messages of `size` bytes, one step of `step_ns`.
    pub fn new(nos: &Nos, n: usize, slot: u32, size: usize, step_ns: f64) -> Sim {
        let rc = (0..n)
            .map(|i| RateControl::new(nos, &format!("h{i}"), 0.0).ok())
            .collect();
        let mut s = Sim {
            rc,
            wire: Vec::new(),
            now: 0.0,
            step_ns,
            size,
            slot,
        };
        s.views();
        s
    }

    /// Every live host sees every other live host.
    fn views(&mut self) {
        let alive: BTreeSet<String> = (0..self.rc.len())
            .filter(|i| self.rc[*i].is_some())
            .map(|i| format!("h{i}"))
            .collect();
        for r in self.rc.iter_mut().flatten() {
            r.set_view(alive.clone(), self.now);
        }
    }

    /// Host `i`'s agent dies: its messages vanish, the others see it go.
    pub fn kill(&mut self, i: usize) {
        self.rc[i] = None;
        self.wire.retain(|(to, _)| *to != i);
        self.views();
    }

    /// Host `i`'s agent starts again, knowing nothing but `nos`.
    pub fn restart(&mut self, i: usize, nos: &Nos) {
        self.rc[i] = RateControl::new(nos, &format!("h{i}"), self.now).ok();
        self.views();
    }

    /// Simulated time, ns.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// One step: deliver last step's messages, let `active` senders send as
    /// much as they may; the bytes each sent.
    pub fn step(&mut self, active: &[bool]) -> Vec<usize> {
        self.now += self.step_ns;
        let now = self.now;
        for (to, m) in std::mem::take(&mut self.wire) {
            let Some(r) = self.rc.get_mut(to).and_then(Option::as_mut) else {
                continue;
            };
            match m {
                Message::RateRequest(ex) => {
                    let resp = r.on_request(&ex, now);
                    // Process `i` runs on host `hi`.
                    self.wire
                        .push((ex.from as usize, Message::RateResponse(resp)));
                }
                Message::RateResponse(ex) => r.on_response(&ex, now),
                _ => {}
            }
        }
        let mut sent = vec![0; self.rc.len()];
        for (i, slot) in self.rc.iter_mut().enumerate() {
            let Some(r) = slot.as_mut() else {
                continue;
            };
            r.tick(now);
            if active.get(i).copied().unwrap_or(false) {
                while let Ok(Admit::Now) = r.admit(self.slot, i as u32, self.size, now) {
                    sent[i] += self.size;
                }
            }
            for (h, m) in r.take_out() {
                self.wire.push((idx(&h), m));
            }
        }
        sent
    }

    /// Runs `secs` with `active` senders; the bytes sent in each step.
    pub fn run(&mut self, active: &[bool], secs: f64) -> Vec<usize> {
        let steps = (secs * 1e9 / self.step_ns) as usize;
        (0..steps).map(|_| self.step(active).iter().sum()).collect()
    }

    /// The fill rate all live hosts hold for the limit, bytes per ns.
    pub fn total_rate(&self) -> f64 {
        self.rc
            .iter()
            .flatten()
            .map(|r| r.local_rates().get(&self.slot).copied().unwrap_or(0.0))
            .sum::<f64>()
            / 1e9
    }
}
