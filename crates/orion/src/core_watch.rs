//! Liveness of dedicated cores, judged the Orion way (sans-IO): counter-slope with
//! k-refresh hysteresis ([`crate::detect::SlopeDetector`]) over the views of
//! [`crate::core_sensors`].
//!
//! **What a view says.** An executor on a dedicated core iterates its loop — and bumps
//! its tick counter — at least every few milliseconds whenever the kernel runs it, busy
//! or idle (an idle executor sleeps at most 5 ms between iterations). So a core is
//! *progressing* at a view when any of its threads ticked since the last view. Flat
//! ticks mean a thread that was not run, or one that is held inside an offcode's code:
//!
//! - *inside* an offcode's turn or command, and either on the CPU (its CPU time
//!   grew: a non-yielding offcode in one long turn) or not asking for it (not
//!   runnable: blocked in a system call) — that is a **stuck
//!   offcode**, not a dead core. The runtime's watchdog owns it (the supervisor fails
//!   a turn that outlives its period); the view counts as progress for the core, and
//!   [`CoreNote::Stuck`] says so once.
//! - otherwise — runnable but not run (waiting for the CPU: a real-time hog, an
//!   interrupt storm, a stalled CPU), or not run at all outside an offcode (frozen,
//!   stopped) — a view **without progress**. So is any view of a CPU whose
//!   `online` file reads 0 (its pinned threads were moved off it by the kernel and may
//!   still tick elsewhere).
//!
//! After `k` views without progress the core is declared dead, with the evidence (the
//! refreshes, the CPU time its threads had, and at how many views they were waiting
//! for it). Recovery is stricter than
//! the first declaration: the kernel keeps starved ordinary threads alive with a
//! trickle (real-time throttling and the fair server lend them 5% of each second), so a
//! dead core recovers only after [`RECOVERY_NS`] of progress at every view.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::core_sensors::{CoreView, ThreadSample};
use crate::detect::{LivenessConfig, SlopeDetector, Transition};
use crate::error::OrionError;

/// The shortest refresh: above twice the longest an idle executor sleeps between ticks.
pub const MIN_REFRESH_NS: u64 = 10_000_000;
/// Progress at every view for this long brings a dead core back; longer than the
/// kernel's one-second period of real-time throttling, whose trickle must not pass.
pub const RECOVERY_NS: u64 = 2_000_000_000;

/// What one view of a core showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// A thread ticked (or a thread is new: its baseline).
    Progress,
    /// No tick, but each thread is held inside an offcode (tids): the watchdog's case.
    Stuck(Vec<i32>),
    /// No tick, and a thread neither ran inside an offcode nor was blocked there.
    Starved {
        /// Time on the CPU since the last view, summed over the threads.
        run_ns: u64,
        /// A thread was runnable (waiting for the CPU) at the view.
        runnable: bool,
    },
    /// The CPU is offline.
    Offline,
}

/// Judges one view against the previous samples of the same threads.
pub fn judge(prev: &BTreeMap<i32, ThreadSample>, view: &CoreView) -> Verdict {
    if view.online == Some(false) {
        return Verdict::Offline;
    }
    let mut stuck = Vec::new();
    let (mut run_ns, mut runnable, mut starved) = (0, false, false);
    for t in &view.threads {
        let Some(p) = prev.get(&t.tid) else {
            return Verdict::Progress;
        };
        if t.ticks != p.ticks {
            return Verdict::Progress;
        }
        let ran = t.run_ns.zip(p.run_ns).map(|(a, b)| a.saturating_sub(b));
        // Inside an offcode: on the CPU, or blocked (not asking for it), or unknown.
        let excused = t.inside && (ran.is_none_or(|r| r > 0) || t.runnable.is_none_or(|r| !r));
        if excused {
            stuck.push(t.tid);
        } else {
            starved = true;
            run_ns += ran.unwrap_or(0);
            runnable |= t.runnable == Some(true);
        }
    }
    if starved {
        Verdict::Starved { run_ns, runnable }
    } else if stuck.is_empty() {
        Verdict::Progress
    } else {
        Verdict::Stuck(stuck)
    }
}

/// A change a refresh made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "note", rename_all = "kebab-case")]
pub enum CoreNote {
    /// Declared dead.
    Declared {
        /// The CPU.
        cpu: u32,
        /// Why, in words.
        evidence: String,
    },
    /// A dead core progressed at every view for [`RECOVERY_NS`].
    Recovered {
        /// The CPU.
        cpu: u32,
        /// Why, in words.
        evidence: String,
    },
    /// Threads held inside an offcode with flat ticks: the watchdog's case, not the
    /// core's (said once per stay).
    Stuck {
        /// The CPU.
        cpu: u32,
        /// The threads.
        tids: Vec<i32>,
    },
}

/// One core's standing.
#[derive(Debug, Clone)]
struct CoreState {
    prev: BTreeMap<i32, ThreadSample>,
    detector: SlopeDetector,
    /// Views judged progressing so far: the detector's liveness counter.
    alive: u64,
    /// Since the last progress: views offline, views with a thread waiting for
    /// the CPU, and the CPU time its threads had.
    offline: u32,
    waiting: u32,
    run_ns: u64,
    stuck_said: bool,
    /// Declared dead; the start of the current run of progressing views.
    dead: bool,
    streak_from: Option<u64>,
}

/// The liveness of every watched core.
#[derive(Debug, Clone)]
pub struct CoreWatch {
    cfg: LivenessConfig,
    cores: BTreeMap<u32, CoreState>,
}

impl CoreWatch {
    /// A watch judging by `cfg` (a refresh of at least [`MIN_REFRESH_NS`]).
    pub fn new(cfg: LivenessConfig) -> Result<CoreWatch, OrionError> {
        if cfg.refresh_ns < MIN_REFRESH_NS {
            return Err(OrionError::Config {
                what: "core watch".to_owned(),
                why: format!(
                    "refresh {} ms: at least {} ms (an idle executor may sleep 5 ms between ticks)",
                    cfg.refresh_ns / 1_000_000,
                    MIN_REFRESH_NS / 1_000_000
                ),
            });
        }
        Ok(CoreWatch {
            cfg,
            cores: BTreeMap::new(),
        })
    }

    /// The settings.
    pub fn config(&self) -> LivenessConfig {
        self.cfg
    }

    /// The cores declared dead and not yet recovered.
    pub fn dead(&self) -> Vec<u32> {
        self.cores
            .iter()
            .filter(|(_, s)| s.dead)
            .map(|(c, _)| *c)
            .collect()
    }

    /// One refresh at `now_ns` over the views fetched for it. A live core without a
    /// view (no thread on it any more) is forgotten; a dead one stays dead until views
    /// of it (a probe's) show its recovery.
    pub fn refresh(&mut self, now_ns: u64, views: &[CoreView]) -> Vec<CoreNote> {
        self.cores
            .retain(|cpu, s| s.dead || views.iter().any(|v| v.cpu == *cpu));
        let mut notes = Vec::new();
        for v in views {
            let cfg = self.cfg;
            let s = self.cores.entry(v.cpu).or_insert_with(|| CoreState {
                prev: BTreeMap::new(),
                detector: SlopeDetector::new(cfg),
                alive: 0,
                offline: 0,
                waiting: 0,
                run_ns: 0,
                stuck_said: false,
                dead: false,
                streak_from: None,
            });
            let verdict = judge(&s.prev, v);
            s.prev = v.threads.iter().map(|t| (t.tid, *t)).collect();
            if let Some(n) = step(cfg, s, v.cpu, now_ns, &verdict) {
                notes.push(n);
            }
        }
        notes
    }
}

/// Applies one verdict to a core's standing.
fn step(
    cfg: LivenessConfig,
    s: &mut CoreState,
    cpu: u32,
    now_ns: u64,
    verdict: &Verdict,
) -> Option<CoreNote> {
    let progressed = matches!(verdict, Verdict::Progress | Verdict::Stuck(_));
    if s.dead {
        if !matches!(verdict, Verdict::Progress) {
            s.streak_from = None;
            return None;
        }
        let from = *s.streak_from.get_or_insert(now_ns);
        if now_ns.saturating_sub(from) < RECOVERY_NS {
            return None;
        }
        s.dead = false;
        s.streak_from = None;
        s.detector = SlopeDetector::new(cfg);
        s.alive = 0;
        s.detector.observe(now_ns, Some(0));
        return Some(CoreNote::Recovered {
            cpu,
            evidence: format!(
                "core {cpu}: its threads ticked at every refresh for {:.0} ms",
                RECOVERY_NS as f64 / 1e6
            ),
        });
    }
    let mut note = None;
    match verdict {
        Verdict::Progress => {
            (s.offline, s.waiting, s.run_ns, s.stuck_said) = (0, 0, 0, false);
        }
        Verdict::Stuck(tids) => {
            (s.offline, s.waiting, s.run_ns) = (0, 0, 0);
            if !std::mem::replace(&mut s.stuck_said, true) {
                note = Some(CoreNote::Stuck {
                    cpu,
                    tids: tids.clone(),
                });
            }
        }
        Verdict::Starved { run_ns, runnable } => {
            s.waiting += u32::from(*runnable);
            s.run_ns += run_ns;
        }
        Verdict::Offline => s.offline += 1,
    }
    if progressed {
        s.alive += 1;
    }
    if let Some(Transition::Declared {
        at_ns,
        last_progress_ns,
        ..
    }) = s.detector.observe(now_ns, Some(s.alive))
    {
        s.dead = true;
        s.streak_from = None;
        return Some(CoreNote::Declared {
            cpu,
            evidence: evidence(cfg, s, cpu, at_ns.saturating_sub(last_progress_ns)),
        });
    }
    note
}

/// The words of a declaration.
fn evidence(cfg: LivenessConfig, s: &CoreState, cpu: u32, flat_ns: u64) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let head = format!(
        "core {cpu}: executor turns flat for {} refreshes of {:.1} ms (no progress for {:.1} ms)",
        cfg.k,
        ms(cfg.refresh_ns),
        ms(flat_ns)
    );
    if s.offline > 0 {
        format!(
            "{head}; CPU {cpu} offline (/sys/devices/system/cpu/cpu{cpu}/online = 0) at {} of them",
            s.offline
        )
    } else {
        format!(
            "{head}; its threads ran {:.1} ms meanwhile and were waiting for the CPU at {} of \
             the {} views (runnable, not run){}",
            ms(s.run_ns),
            s.waiting,
            cfg.k,
            if s.waiting == 0 {
                ": not runnable outside an offcode — stopped or frozen"
            } else {
                ""
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn cfg(k: u32) -> LivenessConfig {
        LivenessConfig::new(25 * MS, k).unwrap()
    }

    /// A view of CPU 1 with one thread (tid 7).
    fn view(ticks: u64, inside: bool, run_ms: u64, runnable: bool) -> CoreView {
        CoreView {
            cpu: 1,
            online: Some(true),
            threads: vec![ThreadSample {
                tid: 7,
                ticks,
                inside,
                run_ns: Some(run_ms * MS),
                runnable: Some(runnable),
            }],
        }
    }

    fn run(w: &mut CoreWatch, views: &[CoreView]) -> Vec<(u64, CoreNote)> {
        let mut out = Vec::new();
        for (i, v) in views.iter().enumerate() {
            let t = i as u64 * 25 * MS;
            for n in w.refresh(t, std::slice::from_ref(v)) {
                out.push((t, n));
            }
        }
        out
    }

    #[test]
    fn a_starved_core_is_declared_after_k_flat_views_with_its_evidence() {
        let mut w = CoreWatch::new(cfg(3)).unwrap();
        // Ticks until view 3, then runnable but never run (inside an offcode at one
        // view: preempted in the middle of a turn).
        let views: Vec<CoreView> = (0..8)
            .map(|i| {
                let t = i.min(3);
                view(t * 100, i == 5, 10 + t, true)
            })
            .collect();
        let notes = run(&mut w, &views);
        assert_eq!(notes.len(), 1, "{notes:?}");
        let (at, CoreNote::Declared { cpu, evidence }) = &notes[0] else {
            panic!("{notes:?}")
        };
        assert_eq!((*at, *cpu), (6 * 25 * MS, 1));
        assert!(
            evidence.contains("core 1: executor turns flat for 3 refreshes of 25.0 ms"),
            "{evidence}"
        );
        assert!(
            evidence.contains("ran 0.0 ms meanwhile and were waiting for the CPU at 3 of the 3"),
            "{evidence}"
        );
        assert_eq!(w.dead(), vec![1]);
    }

    #[test]
    fn an_idle_but_healthy_core_is_never_declared() {
        // An idle executor still ticks (it sleeps between iterations): never flat.
        let mut w = CoreWatch::new(cfg(1)).unwrap();
        let views: Vec<CoreView> = (0..400)
            .map(|i| view(i * 5, false, i / 10, i % 2 == 0))
            .collect();
        assert!(run(&mut w, &views).is_empty());
    }

    #[test]
    fn an_offcode_stuck_in_one_long_turn_is_not_a_dead_core() {
        let mut w = CoreWatch::new(cfg(2)).unwrap();
        // Inside an offcode with flat ticks, on the CPU the whole time.
        let mut views = vec![view(10, false, 5, true)];
        views.extend((1..20).map(|i| view(11, true, 5 + i * 25, true)));
        // Then blocked in a system call inside it: not running, not runnable.
        views.extend((0..10).map(|_| view(11, true, 500, false)));
        let notes = run(&mut w, &views);
        assert_eq!(
            notes.iter().map(|n| &n.1).collect::<Vec<_>>(),
            vec![&CoreNote::Stuck {
                cpu: 1,
                tids: vec![7]
            }],
            "said once, never declared"
        );
        // But inside an offcode and runnable without running is the core's doing.
        let mut w = CoreWatch::new(cfg(2)).unwrap();
        let mut views = vec![view(10, true, 5, true)];
        views.extend((1..4).map(|_| view(10, true, 5, true)));
        assert!(matches!(
            run(&mut w, &views).last(),
            Some((_, CoreNote::Declared { .. }))
        ));
        // And so is a thread not run outside an offcode (stopped, frozen).
        let mut w = CoreWatch::new(cfg(2)).unwrap();
        let views: Vec<CoreView> = (0..4).map(|_| view(10, false, 5, false)).collect();
        let notes = run(&mut w, &views);
        let Some((_, CoreNote::Declared { evidence, .. })) = notes.last() else {
            panic!("{notes:?}")
        };
        assert!(evidence.contains("stopped or frozen"), "{evidence}");
    }

    #[test]
    fn an_offline_cpu_is_declared_even_if_its_threads_tick_elsewhere() {
        let mut w = CoreWatch::new(cfg(2)).unwrap();
        let mut views: Vec<CoreView> = (0..5).map(|i| view(i, false, i, true)).collect();
        for v in &mut views[2..] {
            v.online = Some(false);
        }
        let notes = run(&mut w, &views);
        let Some((_, CoreNote::Declared { evidence, .. })) = notes.first() else {
            panic!("{notes:?}")
        };
        assert!(
            evidence.contains("CPU 1 offline (/sys/devices/system/cpu/cpu1/online = 0) at 2"),
            "{evidence}"
        );
    }

    #[test]
    fn recovery_needs_progress_at_every_view_for_the_whole_span() {
        let mut w = CoreWatch::new(cfg(1)).unwrap();
        let per = (RECOVERY_NS / (25 * MS)) as usize;
        let mut views = vec![view(0, false, 0, true), view(0, false, 0, true)];
        let mut ticks = 0;
        // A trickle: one progressing view in every four, for a long time.
        for i in 0..(per * 3) {
            if i % 4 == 0 {
                ticks += 1;
            }
            views.push(view(ticks, false, 0, true));
        }
        // Then steady progress.
        for _ in 0..(per + 2) {
            ticks += 1;
            views.push(view(ticks, false, 0, true));
        }
        let notes = run(&mut w, &views);
        let kinds: Vec<&str> = notes
            .iter()
            .map(|(_, n)| match n {
                CoreNote::Declared { .. } => "declared",
                CoreNote::Recovered { .. } => "recovered",
                CoreNote::Stuck { .. } => "stuck",
            })
            .collect();
        assert_eq!(kinds, ["declared", "recovered"]);
        let steady_from = (2 + per * 3) as u64 * 25 * MS;
        assert!(notes[1].0 >= steady_from + RECOVERY_NS - 25 * MS);
        assert!(w.dead().is_empty());
    }

    #[test]
    fn a_core_whose_threads_left_is_forgotten_unless_dead() {
        let mut w = CoreWatch::new(cfg(1)).unwrap();
        w.refresh(0, &[view(1, false, 0, true)]);
        assert!(w.refresh(25 * MS, &[]).is_empty());
        // Watched afresh: its first view is a baseline, not a miss.
        assert!(w.refresh(50 * MS, &[view(1, false, 0, true)]).is_empty());
        assert!(matches!(
            w.refresh(75 * MS, &[view(1, false, 0, true)])[..],
            [CoreNote::Declared { .. }]
        ));
        w.refresh(100 * MS, &[]);
        assert_eq!(w.dead(), vec![1], "dead cores stay dead without views");
    }

    #[test]
    fn a_refresh_below_the_minimum_is_refused() {
        let e = CoreWatch::new(LivenessConfig::new(MS, 3).unwrap()).unwrap_err();
        assert!(e.to_string().contains("at least 10 ms"), "{e}");
    }
}
