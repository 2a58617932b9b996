//! Property tests: several DisCo endpoints driven against each other with
//! random accesses, releases and manager changes, and messages delivered in
//! random orders (FIFO per pair of endpoints, as the seed requires). After
//! every step: one writer at most, and no reader sees a stale value; at the
//! end, every access completed and all endpoints agree on manager and owner.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed case

use std::collections::{BTreeMap, VecDeque};

use proptest::prelude::*;
use sidecore_disco::msg::Msg;
use sidecore_disco::{Access, Endpoint, Engine, Event, Moesi, ObjectId};

const ENDPOINTS: u32 = 4;
const OBJECTS: u64 = 2;

#[derive(Debug, Clone)]
enum Op {
    Read(u32, u64),
    Write(u32, u64, u8),
    Release(u32, u64),
    Chman(u64, u32),
    Deliver(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let e = 0..ENDPOINTS;
    let o = 0..OBJECTS;
    prop_oneof![
        2 => (e.clone(), o.clone()).prop_map(|(e, o)| Op::Read(e, o)),
        2 => (e.clone(), o.clone(), any::<u8>()).prop_map(|(e, o, v)| Op::Write(e, o, v)),
        1 => (e.clone(), o.clone()).prop_map(|(e, o)| Op::Release(e, o)),
        1 => (o, e).prop_map(|(o, e)| Op::Chman(o, e)),
        8 => any::<usize>().prop_map(Op::Deliver),
    ]
}

fn obj(i: u64) -> ObjectId {
    ObjectId((i + 1) << 32)
}

struct Sim {
    es: Vec<Engine>,
    chans: BTreeMap<(u32, u32), VecDeque<Msg>>,
    latest: BTreeMap<ObjectId, Vec<u8>>,
    /// Writes waiting for their grant: (endpoint index, object) → value.
    writes: BTreeMap<(usize, ObjectId), u8>,
    reads: BTreeMap<(usize, ObjectId), ()>,
}

impl Sim {
    fn new() -> Sim {
        let all: Vec<Endpoint> = (1..=ENDPOINTS).map(Endpoint).collect();
        let mut es: Vec<Engine> = all.iter().map(|e| Engine::new(*e)).collect();
        let mut latest = BTreeMap::new();
        for i in 0..OBJECTS {
            let manager = all[(i % u64::from(ENDPOINTS)) as usize];
            for e in &mut es {
                e.create(obj(i), manager, &all, vec![0]);
            }
            latest.insert(obj(i), vec![0]);
        }
        Sim {
            es,
            chans: BTreeMap::new(),
            latest,
            writes: BTreeMap::new(),
            reads: BTreeMap::new(),
        }
    }

    fn collect(&mut self) {
        for i in 0..self.es.len() {
            let from = self.es[i].me().0;
            for (to, m) in self.es[i].take_output() {
                self.chans.entry((from, to.0)).or_default().push_back(m);
            }
            for ev in self.es[i].take_events() {
                if let Event::Granted { obj, .. } = ev {
                    self.complete(i, obj);
                }
            }
        }
    }

    /// A granted access is retried, as a faulting task would.
    fn complete(&mut self, i: usize, o: ObjectId) {
        if let Some(v) = self.writes.get(&(i, o)).copied()
            && self.es[i].access(o, Access::Write).unwrap()
        {
            self.es[i].write(o, vec![v]).unwrap();
            self.latest.insert(o, vec![v]);
            self.writes.remove(&(i, o));
        }
        if self.reads.contains_key(&(i, o)) && self.es[i].access(o, Access::Read).unwrap() {
            assert_eq!(
                self.es[i].read(o).unwrap(),
                &self.latest[&o][..],
                "stale read"
            );
            self.reads.remove(&(i, o));
        }
    }

    fn step(&mut self, op: &Op) {
        if std::env::var_os("DISCO_TRACE").is_some() && !matches!(op, Op::Deliver(_)) {
            eprintln!("op {op:?}");
        }
        match *op {
            Op::Read(e, o) => {
                let (i, o) = (e as usize, obj(o));
                if self.es[i].access(o, Access::Read).unwrap() {
                    assert_eq!(
                        self.es[i].read(o).unwrap(),
                        &self.latest[&o][..],
                        "stale read"
                    );
                } else {
                    self.reads.insert((i, o), ());
                }
            }
            Op::Write(e, o, v) => {
                let (i, o) = (e as usize, obj(o));
                if self.es[i].access(o, Access::Write).unwrap() {
                    self.es[i].write(o, vec![v]).unwrap();
                    self.latest.insert(o, vec![v]);
                } else {
                    self.writes.insert((i, o), v);
                }
            }
            Op::Release(e, o) => {
                let (i, o) = (e as usize, obj(o));
                if self.writes.contains_key(&(i, o)) || self.reads.contains_key(&(i, o)) {
                    return; // a task with an access in flight does not release
                }
                // Refused (an access in flight) is a legal answer.
                let _ = self.es[i].release(o);
            }
            Op::Chman(o, to) => {
                let o = obj(o);
                if let Some(m) = self.es.iter().position(|e| e.is_manager(o))
                    && m as u32 != to
                {
                    self.es[m].change_manager(o, Endpoint(to + 1)).unwrap();
                }
            }
            Op::Deliver(k) => self.deliver(k),
        }
        self.collect();
        self.check_safety();
    }

    fn deliver(&mut self, k: usize) {
        let busy: Vec<(u32, u32)> = self
            .chans
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if busy.is_empty() {
            return;
        }
        let (from, to) = busy[k % busy.len()];
        let m = self
            .chans
            .get_mut(&(from, to))
            .unwrap()
            .pop_front()
            .unwrap();
        let shown = format!("{m:?}");
        if std::env::var_os("DISCO_TRACE").is_some() {
            eprintln!("{from}->{to}: {shown}");
        }
        self.es[(to - 1) as usize]
            .handle(Endpoint(from), m)
            .unwrap_or_else(|e| panic!("{e} (delivering {shown})"));
    }

    fn check_safety(&self) {
        for (o, v) in &self.latest {
            let writable: Vec<usize> = (0..self.es.len())
                .filter(|i| matches!(self.es[*i].state(*o), Moesi::M | Moesi::E))
                .collect();
            assert!(writable.len() <= 1, "{o}: several writers {writable:?}");
            if let Some(w) = writable.first() {
                for (i, e) in self.es.iter().enumerate() {
                    if i != *w {
                        assert_eq!(e.state(*o), Moesi::I, "{o}: a copy beside the writer");
                    }
                }
            }
            for e in &self.es {
                if let Some(d) = e.read(*o) {
                    assert_eq!(d, &v[..], "{o}: {} holds a stale copy", e.me());
                }
            }
            assert!(self.es.iter().filter(|e| e.is_owner(*o)).count() <= 1);
        }
    }

    fn settle(&mut self, mut k: usize) {
        for _ in 0..100_000 {
            if self.chans.values().all(VecDeque::is_empty) {
                break;
            }
            k = k.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            self.deliver(k >> 33);
            self.collect();
            self.check_safety();
        }
        assert!(
            self.chans.values().all(VecDeque::is_empty),
            "messages never settled"
        );
    }

    fn check_quiescent(&self) {
        assert!(
            self.writes.is_empty(),
            "writes never granted: {:?}",
            self.writes
        );
        assert!(
            self.reads.is_empty(),
            "reads never granted: {:?}",
            self.reads
        );
        for o in self.latest.keys() {
            let managers: Vec<&Engine> = self.es.iter().filter(|e| e.is_manager(*o)).collect();
            assert_eq!(managers.len(), 1, "{o}: one manager");
            let m = managers[0].me();
            for e in &self.es {
                assert_eq!(
                    e.manager(*o),
                    Some(m),
                    "{o}: {} disagrees on the manager",
                    e.me()
                );
                assert_eq!(e.pending(*o), None);
            }
            let owners: Vec<&Engine> = self.es.iter().filter(|e| e.is_owner(*o)).collect();
            assert_eq!(owners.len(), 1, "{o}: one owner");
            assert_eq!(managers[0].recorded_owner(*o), Some(owners[0].me()));
            let copyset = owners[0].copyset(*o);
            for e in &self.es {
                if e.read(*o).is_some() && e.me() != owners[0].me() {
                    assert!(
                        copyset.contains(&e.me()),
                        "{o}: sharer {} unknown to the owner",
                        e.me()
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn coherence_holds_under_any_message_order(ops in prop::collection::vec(op(), 1..200), seed in any::<usize>()) {
        let mut sim = Sim::new();
        for op in &ops {
            sim.step(op);
        }
        sim.settle(seed);
        sim.check_quiescent();
    }

    #[test]
    fn stream_bytes_arrive_in_order_through_buffer_moves(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..50), 1..30),
        reads in prop::collection::vec(1usize..40, 1..60),
        moves in prop::collection::vec(any::<bool>(), 1..60),
    ) {
        use sidecore_disco::stream::{Reader, Writer};
        use sidecore_disco::VnodeId;
        let v = VnodeId(9);
        let w_ep = Endpoint(1);
        let mut at = Endpoint(2);
        let mut w = Writer::new(v, at, 64);
        let mut r = Reader::new(v, w_ep, 64);
        let mut to_reader: VecDeque<Msg> = VecDeque::new();
        let want: Vec<u8> = chunks.concat();
        let mut got = Vec::new();
        let mut ci = chunks.iter();
        let mut round = 0;
        loop {
            round += 1;
            prop_assert!(round < 10_000, "the stream stalled");
            if let Some(c) = ci.next() {
                to_reader.extend(w.write(c).into_iter().map(|(_, m)| m));
            } else if !w.done() {
                to_reader.extend(w.close().into_iter().map(|(_, m)| m));
            }
            if moves[round % moves.len()] && round % 3 == 0 {
                // A new reader steals the buffer; pushes in flight to the old
                // one are forwarded (the old side delivers them here too).
                let next = Endpoint(at.0 + 1);
                let (_, m) = r.give_buffer(next);
                let Msg::Streampushbuf { data, eof, .. } = m else { unreachable!() };
                let unreported = r.unreported();
                let (nr, stat) = Reader::from_buffer(v, w_ep, 64, data, eof, unreported);
                r = nr;
                at = next;
                w.reader_moved(at);
                if let Some((_, Msg::Streamstat { delta, .. })) = stat {
                    to_reader.extend(w.on_stat(delta).unwrap().into_iter().map(|(_, m)| m));
                }
            }
            while let Some(Msg::Streampush { data, eof, .. }) = to_reader.pop_front() {
                prop_assert!(r.on_push(&data, eof).unwrap().is_empty());
            }
            let (bytes, stat) = r.read(reads[round % reads.len()]);
            got.extend(bytes);
            if let Some((_, Msg::Streamstat { delta, .. })) = stat {
                to_reader.extend(w.on_stat(delta).unwrap().into_iter().map(|(_, m)| m));
            }
            if r.at_eof() && w.done() && to_reader.is_empty() {
                break;
            }
        }
        prop_assert_eq!(got, want);
    }
}
