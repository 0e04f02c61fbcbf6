//! Engines of every rank over the in-memory fabric, driven in one thread with an instant
//! control plane: collectives are bit-exact with and without NIC failures in the middle,
//! and failures produce migrations, never errors, while every node keeps a NIC. A control plane
//! with latency (receipts arriving late) moves sends to their private copies, results unchanged.
#![allow(
    clippy::unwrap_used,
    clippy::needless_range_loop,
    reason = "test code: a panic is a failure; rank loops index several per-rank tables"
)]

use crate::engine::{Engine, EngineConfig, EngineEvent};
use proptest::prelude::*;
use r2ccl_algo::{build_rank_schedule, Collective, Fabric as AlgoFabric, Layout, ScheduleRequest};
use r2ccl_core::{DType, HealthView, NicId, Rank, ReduceOp};
use r2ccl_detect::Verdict;
use r2ccl_transport::{FabricConfig, FaultAction, MemFabric, Topology};
use std::time::Duration;

struct Cluster {
    fabric: MemFabric,
    engines: Vec<Engine>,
    nodes: usize,
    rpn: usize,
    nics: usize,
    now: Duration,
    events: Vec<(u32, EngineEvent)>,
    /// Latency of control messages (receipts, migration agreement); zero: delivered at once.
    ctrl_delay: Duration,
    /// Control messages on their way: (delivery time, from, to, bytes).
    ctrl_in_flight: Vec<(Duration, Rank, Rank, Vec<u8>)>,
    /// Explicit receipts (`Ctrl::RecvDone`) delivered so far.
    receipts: usize,
}

impl Cluster {
    fn new(nodes: u32, rpn: u32, nics: u16, seed: u64) -> Self {
        Self::new_with(nodes, rpn, nics, seed, false)
    }

    /// As [`Cluster::new`]; with `local_completion` a send completes when posted, as over TCP
    /// (a black hole then loses bytes whose sends completed).
    fn new_with(nodes: u32, rpn: u32, nics: u16, seed: u64, local_completion: bool) -> Self {
        let fabric = MemFabric::new(FabricConfig {
            nodes,
            ranks_per_node: rpn,
            nics_per_node: nics,
            nic_bytes_per_sec: 1_000_000_000,
            seed,
            local_completion,
            ..FabricConfig::default()
        });
        let world = nodes * rpn;
        let engines = (0..world)
            .map(|r| {
                let topo = Topology::uniform(nodes, rpn, nics, 1).unwrap();
                let mut cfg = EngineConfig::default();
                cfg.session.chunk_size = 16 * 1024;
                cfg.stall_timeout = Duration::from_millis(20);
                Engine::new(Rank(r), world, cfg, topo).unwrap()
            })
            .collect();
        Self {
            fabric,
            engines,
            nodes: nodes as usize,
            rpn: rpn as usize,
            nics: nics as usize,
            now: Duration::ZERO,
            events: Vec::new(),
            ctrl_delay: Duration::ZERO,
            ctrl_in_flight: Vec::new(),
            receipts: 0,
        }
    }

    fn step(&mut self) {
        let now = self.now;
        for r in 0..self.engines.len() {
            let mut port = self.fabric.port(Rank(r as u32)).unwrap();
            self.engines[r].drive(now, &mut port).unwrap();
        }
        loop {
            let mut any = false;
            let due: Vec<_> = if self.ctrl_in_flight.iter().any(|m| m.0 <= now) {
                let (due, later) = std::mem::take(&mut self.ctrl_in_flight).into_iter().partition(|m| m.0 <= now);
                self.ctrl_in_flight = later;
                due
            } else {
                Vec::new()
            };
            for (_, from, to, bytes) in due {
                any = true;
                self.receipts += usize::from(is_receipt(&bytes));
                let mut port = self.fabric.port(to).unwrap();
                self.engines[to.index()].handle_ctrl(now, &mut port, from, &bytes).unwrap();
            }
            for r in 0..self.engines.len() {
                while let Some((to, bytes)) = self.engines[r].poll_outbox() {
                    if !self.ctrl_delay.is_zero() {
                        self.ctrl_in_flight.push((now + self.ctrl_delay, Rank(r as u32), to, bytes));
                        continue;
                    }
                    any = true;
                    self.receipts += usize::from(is_receipt(&bytes));
                    let mut port = self.fabric.port(to).unwrap();
                    self.engines[to.index()].handle_ctrl(now, &mut port, Rank(r as u32), &bytes).unwrap();
                }
                while let Some(ev) = self.engines[r].poll_event() {
                    self.events.push((r as u32, ev));
                }
            }
            if !any {
                break;
            }
        }
        let mut next = now + Duration::from_millis(1);
        if let Some(t) = self.fabric.next_event_time() {
            next = next.min(t);
        }
        for e in &self.engines {
            if let Some(t) = e.poll_timeout() {
                next = next.min(t);
            }
        }
        for m in &self.ctrl_in_flight {
            next = next.min(m.0);
        }
        self.fabric.advance(now);
        self.now = next.max(now + Duration::from_nanos(500));
    }

    /// Run one collective on every rank; returns every rank's output.
    fn run(&mut self, seq: u64, coll: Collective, dtype: DType, count: u64, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        self.run_with(seq, ScheduleRequest::new(coll, dtype, count), inputs)
    }

    fn run_with(&mut self, seq: u64, req: ScheduleRequest, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        self.run_planned(seq, HealthView::uniform(self.nodes, self.nics, 100_000), req, inputs)
    }

    /// As [`Cluster::run_with`], with the schedule built for `view` (a degraded plan).
    fn run_planned(&mut self, seq: u64, view: HealthView, req: ScheduleRequest, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let world = self.engines.len();
        let layout = Layout::uniform(self.nodes, self.rpn, self.nics).unwrap();
        let af = AlgoFabric::new(layout, view).unwrap();
        let mut out_lens = Vec::new();
        for r in 0..world {
            let sched = build_rank_schedule(&af, &req, Rank(r as u32)).unwrap();
            let out = vec![0u8; sched.output_len as usize];
            out_lens.push(out.len());
            let mut port = self.fabric.port(Rank(r as u32)).unwrap();
            self.engines[r].start(self.now, &mut port, seq, sched, &inputs[r], &out).unwrap();
        }
        self.finish(seq);
        (0..world)
            .map(|r| {
                let port = self.fabric.port(Rank(r as u32)).unwrap();
                self.engines[r].output(&port, out_lens[r]).unwrap()
            })
            .collect()
    }

    /// Step until every rank finished collective `seq` (10 s of fabric time at most).
    fn finish(&mut self, seq: u64) {
        let deadline = self.now + Duration::from_secs(10);
        let mut finished = vec![false; self.engines.len()];
        while !finished.iter().all(|f| *f) {
            assert!(
                self.now < deadline,
                "collective {seq} did not finish; waiting: {:?}",
                self.engines.iter().map(Engine::waiting).collect::<Vec<_>>()
            );
            self.step();
            for (r, f) in finished.iter_mut().enumerate() {
                if self.engines[r].take_finished() == Some(seq) {
                    *f = true;
                }
            }
        }
        // Small sends may linger past the collective, migrating if they must, until their
        // receipts come (held back by the receivers, at most RECEIPT_DELAY when no later chunk
        // implies them).
        assert!(
            self.run_until(Duration::from_secs(2), |c| c.engines.iter().all(|e| e.lingering() == 0)),
            "collective {seq}: sends still lingering: {:?}",
            self.engines.iter().map(Engine::lingering).collect::<Vec<_>>()
        );
        // Every send is acknowledged: no lane may still look for a path (a stale one would fail a
        // later collective when its no-path timeout ran out).
        self.step();
        let pending: Vec<usize> = self.engines.iter().map(Engine::pending_lanes).collect();
        assert!(pending.iter().all(|&n| n == 0), "collective {seq} left lanes behind: {pending:?}");
    }

    /// As [`Cluster::run_with`], on registered regions the engines read and write in place:
    /// one region per rank holding both buffers (`in_place`, NCCL's convention: AllGather's
    /// input is this rank's block of the output, ReduceScatter's output this rank's block of
    /// the input) or one each.
    fn run_registered(&mut self, seq: u64, req: ScheduleRequest, inputs: &[Vec<u8>], in_place: bool) -> Vec<Vec<u8>> {
        use r2ccl_transport::Transport as _;
        let world = self.engines.len();
        let layout = Layout::uniform(self.nodes, self.rpn, self.nics).unwrap();
        let af = AlgoFabric::new(layout, HealthView::uniform(self.nodes, self.nics, 100_000)).unwrap();
        let mut outs = Vec::new();
        for r in 0..world {
            let sched = build_rank_schedule(&af, &req, Rank(r as u32)).unwrap();
            let (il, ol) = (sched.input_len as usize, sched.output_len as usize);
            let mut port = self.fabric.port(Rank(r as u32)).unwrap();
            let (input, output) = if in_place {
                let (i_at, o_at) = if il < ol {
                    (r * il, 0)
                } else if ol < il {
                    (0, r * ol)
                } else {
                    (0, 0)
                };
                let h = port.register(il.max(ol).max(1)).unwrap();
                ((h, i_at), (h, o_at))
            } else {
                ((port.register(il.max(1)).unwrap(), 0), (port.register(ol.max(1)).unwrap(), 0))
            };
            port.region_mut(input.0).unwrap()[input.1..input.1 + il].copy_from_slice(&inputs[r]);
            self.engines[r].start_registered(self.now, &mut port, seq, sched, input, output).unwrap();
            outs.push((output, ol));
        }
        self.finish(seq);
        (0..world)
            .map(|r| {
                let ((h, at), len) = outs[r];
                let port = self.fabric.port(Rank(r as u32)).unwrap();
                port.region(h).unwrap()[at..at + len].to_vec()
            })
            .collect()
    }

    /// Step until `done` holds or `limit` of fabric time passed; whether it held.
    fn run_until(&mut self, limit: Duration, done: impl Fn(&Self) -> bool) -> bool {
        let deadline = self.now + limit;
        while self.now < deadline {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Run float32 AllReduces `1..=n` of `count` elements (recursive doubling) back to back, as
    /// callers in a loop do:
    /// each rank starts the next collective as soon as it finished the last (its small sends may
    /// still linger). Whether each rank's output of each was exact.
    fn run_back_to_back(&mut self, n: u64, count: usize) -> Vec<bool> {
        let world = self.engines.len();
        let layout = Layout::uniform(self.nodes, self.rpn, self.nics).unwrap();
        let af = AlgoFabric::new(layout, HealthView::uniform(self.nodes, self.nics, 100_000)).unwrap();
        let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64)
            .with_algorithm(r2ccl_algo::Algorithm::Tree);
        let inputs: Vec<Vec<Vec<u8>>> = (1..=n).map(|seq| inputs_f32(world, count, seq as u32)).collect();
        let start = |c: &mut Self, r: usize, seq: u64| {
            let sched = build_rank_schedule(&af, &req, Rank(r as u32)).unwrap();
            let out = vec![0u8; sched.output_len as usize];
            let mut port = c.fabric.port(Rank(r as u32)).unwrap();
            c.engines[r].start(c.now, &mut port, seq, sched, &inputs[seq as usize - 1][r], &out).unwrap();
        };
        let mut at = vec![1u64; world];
        for r in 0..world {
            start(self, r, 1);
        }
        let mut exact = Vec::new();
        let deadline = self.now + Duration::from_secs(10);
        while at.iter().any(|&s| s <= n) {
            assert!(self.now < deadline, "collectives did not finish: at {at:?}");
            self.step();
            for r in 0..world {
                if at[r] <= n && self.engines[r].take_finished() == Some(at[r]) {
                    let port = self.fabric.port(Rank(r as u32)).unwrap();
                    let out = self.engines[r].output(&port, count * 4).unwrap();
                    exact.push(out == allreduce_expected(&inputs[at[r] as usize - 1]));
                    at[r] += 1;
                    if at[r] <= n {
                        start(self, r, at[r]);
                    }
                }
            }
        }
        exact
    }

    fn migrations(&self) -> usize {
        self.events.iter().filter(|(_, e)| matches!(e, EngineEvent::Migrated { .. })).count()
    }
}

/// Whether a control frame is an explicit receipt.
fn is_receipt(bytes: &[u8]) -> bool {
    matches!(bytes.split_first(), Some((&crate::engine::FRAME_CTRL, body))
        if matches!(crate::ctrl::Ctrl::decode(body), Ok(crate::ctrl::Ctrl::RecvDone { .. })))
}

/// Small integers as f32 so every association order gives the same sum.
fn inputs_f32(world: usize, count: usize, salt: u32) -> Vec<Vec<u8>> {
    (0..world)
        .map(|r| {
            (0..count)
                .flat_map(|i| ((((i as u32).wrapping_mul(31) ^ (r as u32 * 7 + salt)) % 64) as f32).to_le_bytes())
                .collect()
        })
        .collect()
}

fn allreduce_expected(inputs: &[Vec<u8>]) -> Vec<u8> {
    let n = inputs[0].len() / 4;
    (0..n)
        .flat_map(|i| {
            let s: f32 = inputs.iter().map(|b| f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap())).sum();
            s.to_le_bytes()
        })
        .collect()
}

#[test]
fn allreduce_is_exact_without_faults() {
    let mut c = Cluster::new(4, 1, 2, 1);
    let count = 100_003;
    let inputs = inputs_f32(4, count, 0);
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    let want = allreduce_expected(&inputs);
    for o in &out {
        assert!(o == &want);
    }
    assert_eq!(c.migrations(), 0);
}

#[test]
fn a_ring_allreduce_sends_without_private_copies_when_receipts_are_prompt() {
    let mut c = Cluster::new(4, 1, 2, 11);
    let count = 1 << 18;
    let inputs = inputs_f32(4, count, 5);
    let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64)
        .with_algorithm(r2ccl_algo::Algorithm::Ring)
        .with_chunks(4);
    let out = c.run_with(1, req, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    // The all-gather overwrites what the reduce-scatter sent, but only after its receipt came.
    assert_eq!(c.engines.iter().map(Engine::moved_sends).sum::<u64>(), 0);
}

/// Small collectives back to back: each finishes without waiting for its receipts (its sends
/// linger in the pool), the next collective's chunks imply them, and only the last collective's
/// receipts are sent, after the receivers held them back. A NIC that goes down in the middle
/// migrates lingering sends like any other; every result is exact either way.
#[test]
fn small_collectives_back_to_back_linger_and_send_almost_no_receipts() {
    for fail in [false, true] {
        let mut c = Cluster::new(4, 1, 2, 21);
        if fail {
            c.fabric.schedule(Duration::from_micros(300), FaultAction::NicDown(NicId::new(1, 0)));
        }
        let n = 40;
        let exact = c.run_back_to_back(n, 64);
        assert_eq!(exact.len(), 4 * n as usize);
        assert!(exact.iter().all(|&e| e), "fail {fail}: every result exact: {exact:?}");
        let (lingered, implied, _) = linger_totals(&c);
        // Recursive doubling on 4 ranks: 2 sends per rank and collective.
        let sends = 4 * 2 * n;
        let explicit = c.receipts;
        assert!(lingered > sends / 2, "fail {fail}: {lingered} of {sends} sends lingered");
        assert!(c.run_until(Duration::from_secs(2), |c| c.engines.iter().all(|e| e.lingering() == 0)));
        let explicit_after = c.receipts;
        let figures = format!(
            "fail {fail}: sends {sends}, lingered {lingered}, implied {implied}, explicit receipts {explicit} during and {explicit_after} in all, migrations {}",
            c.migrations()
        );
        if fail {
            assert!(c.migrations() > 0, "the NIC failure caused migrations: {figures}");
        } else {
            // Only the last collective's receipts go out, after the receivers held them back.
            assert_eq!(implied, sends - 8, "every receipt but the last collective's was implied: {figures}");
            assert_eq!(explicit_after, 8, "explicit receipts: the last collective's only: {figures}");
        }
        assert!(c.engines.iter().all(|e| e.pending_lanes() == 0), "no lane left looking for a path");
        let refused: Vec<_> = c.events.iter().filter(|(_, e)| matches!(e, EngineEvent::BadInput { .. })).collect();
        assert!(refused.is_empty(), "late or implied receipts are not refused input: {refused:?}");
    }
}

/// Every engine's linger counters, summed.
fn linger_totals(c: &Cluster) -> (u64, u64, u64) {
    c.engines.iter().map(Engine::linger_counts).fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2))
}

/// A black hole that swallows the chunks of sends whose collective already finished at the
/// sender (lingering, unconfirmed; sends complete when posted, as over TCP): they are replayed
/// from the linger pool on the other rail and every result stays exact. The fault time sweeps
/// across the run, so some lands in that window.
#[test]
fn lingering_sends_lost_to_a_black_hole_are_replayed_from_the_pool() {
    let mut lingering_migrated = 0;
    for at_us in (20..400).step_by(20) {
        let mut c = Cluster::new_with(4, 1, 2, 5 + at_us, true);
        c.fabric.schedule(Duration::from_micros(at_us), FaultAction::BlackHole(NicId::new(2, 0), true));
        let exact = c.run_back_to_back(12, 16);
        assert!(exact.iter().all(|&e| e), "black hole at {at_us} us: every result exact: {exact:?}");
        assert!(c.run_until(Duration::from_secs(2), |c| c.engines.iter().all(|e| e.lingering() == 0)));
        lingering_migrated += linger_totals(&c).2;
    }
    assert!(lingering_migrated > 0, "no lingering send had to migrate: the sweep missed the window");
}

/// An AlltoAll of small blocks among 20 ranks: each sends to 19 peers, more than a receiver
/// holds receipts back for (a sender's pool might not hold that many small sends), so receipts
/// go at once and no collective waits out the hold-back delay; results exact.
#[test]
fn small_alltoall_among_many_peers_does_not_wait_for_held_back_receipts() {
    let world = 20u32;
    let mut c = Cluster::new(world, 1, 1, 9);
    let layout = Layout::uniform(world as usize, 1, 1).unwrap();
    let af = AlgoFabric::new(layout, HealthView::uniform(world as usize, 1, 100_000)).unwrap();
    let req = ScheduleRequest::new(Collective::AlltoAll, DType::I32, 16 * u64::from(world));
    for seq in 1..=3u64 {
        let scheds: Vec<_> = (0..world).map(|r| build_rank_schedule(&af, &req, Rank(r)).unwrap()).collect();
        let inputs: Vec<Vec<u8>> = scheds
            .iter()
            .enumerate()
            .map(|(r, s)| {
                (0..s.input_len / 4).flat_map(|i| (i as i32 * 7 + r as i32 * 1000 + seq as i32).to_le_bytes()).collect()
            })
            .collect();
        let want = r2ccl_algo::execute(&scheds, &inputs, r2ccl_algo::ExecOrder::Program).unwrap();
        let start = c.now;
        let mut finished_at = vec![None; world as usize];
        for r in 0..world as usize {
            let out = vec![0u8; scheds[r].output_len as usize];
            let mut port = c.fabric.port(Rank(r as u32)).unwrap();
            c.engines[r].start(c.now, &mut port, seq, scheds[r].clone(), &inputs[r], &out).unwrap();
        }
        while finished_at.iter().any(Option::is_none) {
            assert!(c.now < start + Duration::from_secs(5), "collective {seq} did not finish");
            c.step();
            for r in 0..world as usize {
                if finished_at[r].is_none() && c.engines[r].take_finished() == Some(seq) {
                    finished_at[r] = Some(c.now);
                    let port = c.fabric.port(Rank(r as u32)).unwrap();
                    let got = c.engines[r].output(&port, scheds[r].output_len as usize).unwrap();
                    assert_eq!(got, want[r], "rank {r}, collective {seq}");
                }
            }
        }
        let took = finished_at.iter().flatten().max().unwrap().saturating_sub(start);
        assert!(
            took < crate::engine::RECEIPT_DELAY,
            "collective {seq} took {took:?}: it waited for held-back receipts"
        );
        // Every transfer's receipt went at once (none held back).
        let transfers = (seq * u64::from(world) * u64::from(world - 1)) as usize;
        assert_eq!(c.receipts, transfers, "collective {seq}: explicit receipts, one per transfer");
    }
}

#[test]
fn late_receipts_move_sends_to_their_private_copies_and_results_stay_exact() {
    for (seed, fail) in [(12u64, false), (13, true)] {
        let mut c = Cluster::new(4, 1, 2, seed);
        // Receipts take longer than a write waits for them past the send's last chunk.
        c.ctrl_delay = crate::engine::PRIVATE_COPY_AFTER * 4;
        if fail {
            c.fabric.schedule(Duration::from_micros(500), FaultAction::NicDown(NicId::new(2, 1)));
        }
        for seq in 1..=2u64 {
            let count = 1 << 18;
            let inputs = inputs_f32(4, count, seq as u32);
            let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64)
                .with_algorithm(r2ccl_algo::Algorithm::Ring)
                .with_chunks(4);
            let out = c.run_with(seq, req, &inputs);
            assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)), "seed {seed} collective {seq}");
        }
        assert!(c.engines.iter().map(Engine::moved_sends).sum::<u64>() > 0, "seed {seed}: no send moved");
        if fail {
            assert!(c.migrations() > 0, "the failure caused migrations");
        }
    }
}

#[test]
fn every_collective_runs_on_registered_regions_in_and_out_of_place() {
    let layout = Layout::uniform(4, 1, 2).unwrap();
    let af = AlgoFabric::new(layout, HealthView::uniform(4, 2, 100_000)).unwrap();
    let sum = ReduceOp::Sum;
    let colls = [
        Collective::AllReduce { op: sum },
        Collective::AllGather,
        Collective::ReduceScatter { op: sum },
        Collective::AlltoAll,
        Collective::Broadcast { root: Rank(2) },
    ];
    for (k, coll) in colls.into_iter().enumerate() {
        for in_place in [false, true] {
            let mut c = Cluster::new(4, 1, 2, 20 + k as u64);
            let req = ScheduleRequest::new(coll, DType::I32, 4096).with_chunks(4);
            let scheds: Vec<_> = (0..4).map(|r| build_rank_schedule(&af, &req, Rank(r)).unwrap()).collect();
            let inputs: Vec<Vec<u8>> = scheds
                .iter()
                .enumerate()
                .map(|(r, s)| {
                    (0..s.input_len / 4).flat_map(|i| (i as i32 * 3 + r as i32 * 1000).to_le_bytes()).collect()
                })
                .collect();
            let want = r2ccl_algo::execute(&scheds, &inputs, r2ccl_algo::ExecOrder::Program).unwrap();
            let got = c.run_registered(1, req, &inputs, in_place);
            assert!(got == want, "{coll:?} in place {in_place}");
        }
    }
}

#[test]
fn latency_optimal_tree_and_tiny_sizes_are_exact() {
    for world in [2u32, 3, 4] {
        let mut c = Cluster::new(world, 1, 2, 7);
        for (seq, count) in [(1u64, 2usize), (2, 1), (3, 0), (4, 33)] {
            let inputs = inputs_f32(world as usize, count, seq as u32);
            let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64)
                .with_algorithm(r2ccl_algo::Algorithm::Tree);
            let out = c.run_with(seq, req, &inputs);
            assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)), "world {world} count {count}");
        }
        // Exchanges (a partner's reply overwrites what went to it) copy at once: no write waits
        // for a receipt that waits for it.
        assert_eq!(c.engines.iter().map(Engine::moved_sends).sum::<u64>(), 0, "world {world}");
    }
}

#[test]
fn nic_down_mid_allreduce_migrates_and_stays_exact() {
    let mut c = Cluster::new(4, 1, 2, 2);
    let count = 1 << 20;
    let inputs = inputs_f32(4, count, 1);
    c.fabric.schedule(Duration::from_millis(3), FaultAction::NicDown(NicId::new(1, 0)));
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    let want = allreduce_expected(&inputs);
    for o in &out {
        assert!(o == &want, "bit-exact after failover");
    }
    assert!(c.migrations() > 0, "the failure caused migrations: {:?}", c.events);
    assert!(c.engines.iter().all(|e| e.down_nics().contains(&NicId::new(1, 0))), "every rank heard of the dead NIC");
    // The next collective still works on the degraded cluster.
    let inputs = inputs_f32(4, 5000, 9);
    let out = c.run(2, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, 5000, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
}

#[test]
fn direct_four_stage_is_exact_on_a_degraded_plan_and_through_a_second_nic_failure() {
    // 4 nodes x 4 NICs, planned with NIC 1/0 lost (node 1 joins the faster level), and NIC 2/1
    // goes down mid-collective: its direct transfers migrate, and every rank's result is exact.
    let mut c = Cluster::new(4, 1, 4, 5);
    let count = 1 << 20;
    let inputs = inputs_f32(4, count, 3);
    let mut view = HealthView::uniform(4, 4, 100_000);
    view.set_failed(NicId::new(1, 0)).unwrap();
    c.fabric.schedule(Duration::from_micros(500), FaultAction::NicDown(NicId::new(2, 1)));
    let req = ScheduleRequest::new(Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64)
        .with_strategy(r2ccl_algo::Strategy::FourStageDirect)
        .with_chunks(4);
    let out = c.run_planned(1, view, req, &inputs);
    let want = allreduce_expected(&inputs);
    for o in &out {
        assert!(o == &want, "bit-exact after failover");
    }
    assert!(c.migrations() > 0, "the failure caused migrations: {:?}", c.events);
}

#[test]
fn silent_black_hole_is_detected_by_stall_and_repaired() {
    let mut c = Cluster::new(3, 1, 2, 3);
    let count = 1 << 21;
    let inputs = inputs_f32(3, count, 2);
    c.fabric.schedule(Duration::from_millis(1), FaultAction::BlackHole(NicId::new(2, 1), true));
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    let want = allreduce_expected(&inputs);
    assert!(out.iter().all(|o| o == &want));
    assert!(c
        .events
        .iter()
        .any(|(_, e)| matches!(e, EngineEvent::PathFailed { fault: r2ccl_transport::PathFault::Timeout, .. })));
    assert!(c.migrations() > 0);
}

/// With a backend that reads the kernel's TCP state ([`Transport::path_evidence`]), a black hole
/// is declared at the stall deadline, without waiting for the probe's timeout: the same
/// collective, the same fault, exact both ways, ends sooner in simulated time.
#[test]
fn kernel_evidence_declares_a_black_hole_before_its_probe_times_out() {
    let mut ends = Vec::new();
    for evidence in [false, true] {
        let mut c = Cluster::new(3, 1, 2, 3);
        c.fabric.set_kernel_evidence(evidence);
        let count = 1 << 21;
        let inputs = inputs_f32(3, count, 2);
        c.fabric.schedule(Duration::from_millis(1), FaultAction::BlackHole(NicId::new(2, 1), true));
        let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
        assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)), "exact with evidence {evidence}");
        let declared: u64 = c.engines.iter().map(Engine::silent_declared).sum();
        assert_eq!(declared > 0, evidence, "paths declared on the kernel's evidence: {declared}");
        assert!(c.migrations() > 0);
        let end = c.now;
        // Localization's probes into the black hole count as unanswered as soon as the kernel
        // sees them unacknowledged: the verdict (every rank takes the NIC out) comes sooner.
        let bad = NicId::new(2, 1);
        let everyone_knows = |c: &Cluster| c.engines.iter().all(|e| e.down_nics().contains(&bad));
        assert!(c.run_until(Duration::from_secs(2), everyone_knows), "every rank took {bad} out");
        ends.push((end, c.now));
    }
    // The probe timeout (50 ms here) is what the evidence saves, at least most of it.
    assert!(ends[1].0 + Duration::from_millis(30) < ends[0].0, "ends without and with evidence: {ends:?}");
    assert!(ends[1].1 < ends[0].1, "verdicts without and with evidence: {ends:?}");
}

#[test]
fn a_black_hole_is_localized_to_its_nic_which_every_rank_takes_out_and_brings_back() {
    let mut c = Cluster::new(3, 1, 2, 5);
    let count = 1 << 21;
    let inputs = inputs_f32(3, count, 4);
    let bad = NicId::new(2, 1);
    c.fabric.schedule(Duration::from_millis(1), FaultAction::BlackHole(bad, true));
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    // Three-point probing (the peer and the third node) blames the NIC, not a link.
    let everyone_knows = |c: &Cluster| c.engines.iter().all(|e| e.down_nics().contains(&bad));
    assert!(c.run_until(Duration::from_secs(2), everyone_knows), "every rank took the blamed NIC out: {:?}", c.events);
    let verdicts: Vec<Verdict> = c
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            EngineEvent::Localized { verdict, .. } => Some(*verdict),
            _ => None,
        })
        .collect();
    assert!(
        verdicts.iter().any(|v| matches!(v, Verdict::LocalNic(n) | Verdict::RemoteNic(n) if *n == bad)),
        "a verdict names {bad}: {verdicts:?}"
    );
    assert!(
        verdicts.iter().all(|v| !matches!(v, Verdict::LocalNic(n) | Verdict::RemoteNic(n) if *n != bad)),
        "{verdicts:?}"
    );
    // The degraded cluster keeps working.
    let inputs = inputs_f32(3, 7000, 5);
    let out = c.run(2, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, 7000, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    // Healed: after the hold-down and consecutive good probes the NIC is back everywhere.
    let healed_at = c.now;
    c.fabric.schedule(healed_at, FaultAction::BlackHole(bad, false));
    let nobody_blames = |c: &Cluster| c.engines.iter().all(|e| !e.down_nics().contains(&bad));
    assert!(c.run_until(Duration::from_secs(10), nobody_blames), "the NIC came back: {:?}", c.events);
    // Hysteresis: three consecutive good probes, 100 ms apart, not the first answer.
    assert!(c.now >= healed_at + Duration::from_millis(200), "recovered after {:?}", c.now - healed_at);
    assert!(c.events.iter().any(|(_, e)| matches!(e, EngineEvent::NicBlamed { nic, up: true } if *nic == bad)));
    let inputs = inputs_f32(3, 7000, 6);
    let out = c.run(3, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, 7000, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
}

#[test]
fn a_verdict_never_takes_a_nodes_last_nic_and_the_collective_resumes_when_it_answers() {
    let mut c = Cluster::new(3, 1, 2, 6);
    let count = 1 << 20;
    let inputs = inputs_f32(3, count, 7);
    let (dead, silent) = (NicId::new(1, 0), NicId::new(1, 1));
    c.fabric.schedule(Duration::from_millis(1), FaultAction::NicDown(dead));
    c.fabric.schedule(Duration::from_millis(3), FaultAction::BlackHole(silent, true));
    c.fabric.schedule(Duration::from_millis(1500), FaultAction::BlackHole(silent, false));
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    let blamed = c.events.iter().any(|(_, e)| {
        matches!(e, EngineEvent::Localized { verdict: Verdict::LocalNic(n) | Verdict::RemoteNic(n), .. } if *n == silent)
    });
    assert!(blamed, "the silent NIC was localized: {:?}", c.events);
    let taken = c.events.iter().any(|(_, e)| {
        matches!(e, EngineEvent::NicState { nic, up: false, .. } | EngineEvent::NicBlamed { nic, up: false } if *nic == silent)
    });
    assert!(!taken, "node 1's last usable NIC stayed in: {:?}", c.events);
    assert!(c.engines.iter().all(|e| e.down_nics().iter().eq([&dead])));
}

#[test]
fn a_blamed_nic_is_put_back_when_its_nodes_other_nic_goes_down() {
    // A verdict takes NIC (2,1) out while its link is up (a black hole); then the link of node 2's
    // other NIC goes down. The node is not gone: its lead puts the blamed NIC back at once, and
    // the collective that runs then finishes, exact, once the black hole heals.
    let mut c = Cluster::new(3, 1, 2, 5);
    let count = 1 << 21;
    let inputs = inputs_f32(3, count, 4);
    let (blamed, dies) = (NicId::new(2, 1), NicId::new(2, 0));
    c.fabric.schedule(Duration::from_millis(1), FaultAction::BlackHole(blamed, true));
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    let everyone_knows = |c: &Cluster| c.engines.iter().all(|e| e.down_nics().contains(&blamed));
    assert!(c.run_until(Duration::from_secs(2), everyone_knows), "every rank took the blamed NIC out: {:?}", c.events);
    let before = c.events.len();
    let t = c.now;
    c.fabric.schedule(t + Duration::from_millis(1), FaultAction::NicDown(dies));
    c.fabric.schedule(t + Duration::from_millis(30), FaultAction::BlackHole(blamed, false));
    let inputs = inputs_f32(3, count, 5);
    let out = c.run(2, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    let put_back = c.events[before..]
        .iter()
        .position(|(r, e)| *r == 2 && matches!(e, EngineEvent::NicBlamed { nic, up: true } if *nic == blamed))
        .expect("node 2's lead put the blamed NIC back");
    let link_down = c.events[before..]
        .iter()
        .position(|(r, e)| {
            *r == 2 && matches!(e, EngineEvent::NicState { nic, up: false, local: true } if *nic == dies)
        })
        .expect("node 2 saw its other NIC's link go down");
    assert!(put_back < link_down, "put back as the link went down, not after a recovery: {:?}", &c.events[before..]);
    assert!(c.engines.iter().all(|e| e.down_nics().iter().eq([&dies])), "only the dead link is down");
}

#[test]
fn nic_flaps_back_and_traffic_fails_back() {
    let mut c = Cluster::new(2, 1, 2, 4);
    let count = 1 << 21;
    let inputs = inputs_f32(2, count, 3);
    c.fabric.schedule(Duration::from_millis(2), FaultAction::NicDown(NicId::new(0, 1)));
    c.fabric.schedule(Duration::from_millis(6), FaultAction::NicUp(NicId::new(0, 1)));
    let out = c.run(1, Collective::AllReduce { op: ReduceOp::Sum }, DType::F32, count as u64, &inputs);
    assert!(out.iter().all(|o| o == &allreduce_expected(&inputs)));
    let failbacks = c.events.iter().filter(|(_, e)| matches!(e, EngineEvent::Migrated { failback: true, .. })).count();
    assert!(failbacks > 0, "traffic moved back after the NIC returned: {:?}", c.events);
}

fn coll_strategy() -> impl Strategy<Value = (Collective, u32)> {
    prop_oneof![
        (0usize..5).prop_map(|o| (Collective::AllReduce { op: ReduceOp::ALL[o] }, 0)),
        Just((Collective::AllGather, 0)),
        (0usize..5).prop_map(|o| (Collective::ReduceScatter { op: ReduceOp::ALL[o] }, 0)),
        (0u32..4).prop_map(|r| (Collective::Broadcast { root: Rank(r) }, r)),
        (0u32..4).prop_map(|r| (Collective::Reduce { op: ReduceOp::Sum, root: Rank(r) }, r)),
        Just((Collective::AlltoAll, 0)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(36))]
    /// Every collective, with a NIC failure at a random time, matches the reference executor,
    /// with an instant control plane or one whose receipts come late (sends then move to their
    /// private copies while a replay may still need their bytes), sends completing on arrival or
    /// when posted (`tcp`: only receipts say the bytes arrived), on the caller's buffers or on
    /// registered regions read and written where they are (`buffers` 1: out of place, 2: in place).
    #[test]
    fn collectives_under_a_random_failure_match_the_reference(
        (coll, _root) in coll_strategy(),
        count in 1u64..20_000,
        fail_at_us in 0u64..4000,
        fail_node in 0u32..4,
        fail_nic in 0u16..2,
        seed in 0u64..1000,
        slow_ctrl in any::<bool>(),
        buffers in 0u8..3,
        tcp in any::<bool>(),
    ) {
        let mut c = Cluster::new_with(4, 1, 2, seed, tcp);
        if slow_ctrl {
            c.ctrl_delay = crate::engine::PRIVATE_COPY_AFTER * 4;
        }
        let layout = Layout::uniform(4, 1, 2).unwrap();
        let af = AlgoFabric::new(layout, HealthView::uniform(4, 2, 100_000)).unwrap();
        let req = ScheduleRequest::new(coll, DType::I32, count);
        let scheds: Vec<_> = (0..4).map(|r| build_rank_schedule(&af, &req, Rank(r)).unwrap()).collect();
        let inputs: Vec<Vec<u8>> = scheds.iter().enumerate().map(|(r, s)| {
            (0..s.input_len / 4).flat_map(|i| ((i as i32 * 13 + r as i32 * 101) % 1000 - 300).to_le_bytes()).collect()
        }).collect();
        let want = r2ccl_algo::execute(&scheds, &inputs, r2ccl_algo::ExecOrder::Program).unwrap();
        c.fabric.schedule(Duration::from_micros(fail_at_us), FaultAction::NicDown(NicId::new(fail_node, fail_nic)));
        let got = match buffers {
            0 => c.run(1, coll, DType::I32, count, &inputs),
            b => c.run_registered(1, req, &inputs, b == 2),
        };
        for r in 0..4 {
            let defined = !matches!(coll, Collective::Reduce { root, .. } if root.0 != r as u32);
            if defined {
                prop_assert!(got[r] == want[r], "rank {} differs for {:?} (buffers {})", r, coll, buffers);
            }
        }
    }
}
