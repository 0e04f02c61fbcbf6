//! Property tests: random layouts, health views, sizes, dtypes, ops, collectives,
//! algorithms and strategies. Every rank's output equals the sequential reduction
//! (inputs are small integers, so every float partial sum is exact and any association
//! order gives the same bits), no transfer touches a failed NIC, and bytes per NIC
//! follow the split weights.
#![allow(clippy::unwrap_used, reason = "tests")]

mod common;

use proptest::prelude::*;
use r2ccl_algo::{
    build_all, Algorithm, Collective, ExecOrder, Fabric, Layout, R2cclParams, ScheduleRequest, StepKind,
    Strategy as Strat, Traffic,
};
use r2ccl_core::{DType, HealthView, NicId, NodeId, Rank, ReduceOp};

#[derive(Debug, Clone)]
struct Case {
    p: usize,
    assign: Vec<u8>,
    nodes: usize,
    nics: usize,
    faults: Vec<(u8, u8, bool)>,
    count: u64,
    dtype: usize,
    op: usize,
    coll: usize,
    a: u32,
    b: u32,
    alg: usize,
    strat: usize,
    tail: bool,
    k: u32,
    chunks: u32,
    shuffle: Option<u64>,
    seed: u64,
}

fn case() -> impl Strategy<Value = Case> {
    (1usize..=64, 1usize..=12)
        .prop_flat_map(|(p, nodes)| {
            let nodes = nodes.min(p);
            (
                (Just(p), proptest::collection::vec(any::<u8>(), p), Just(nodes), 1usize..=4),
                proptest::collection::vec((any::<u8>(), any::<u8>(), any::<bool>()), 0..6),
                prop_oneof![Just(0u64), Just(1u64), 2u64..40],
                (0usize..10, 0usize..5, 0usize..8, any::<u32>(), any::<u32>()),
                (0usize..4, 0usize..6, any::<bool>(), 1u32..=4, 1u32..=3),
                (proptest::option::of(any::<u64>()), any::<u64>()),
            )
        })
        .prop_map(
            |(
                (p, assign, nodes, nics),
                faults,
                count,
                (dtype, op, coll, a, b),
                (alg, strat, tail, k, chunks),
                (shuffle, seed),
            )| {
                Case {
                    p,
                    assign,
                    nodes,
                    nics,
                    faults,
                    count,
                    dtype,
                    op,
                    coll,
                    a,
                    b,
                    alg,
                    strat,
                    tail,
                    k,
                    chunks,
                    shuffle,
                    seed,
                }
            },
        )
}

fn fabric_of(c: &Case) -> Fabric {
    let rank_node: Vec<NodeId> = (0..c.p)
        .map(|i| NodeId(if i < c.nodes { i as u32 } else { u32::from(c.assign[i]) % c.nodes as u32 }))
        .collect();
    let layout = Layout::from_rank_nodes(rank_node, c.nics).unwrap();
    let mut view = HealthView::uniform(c.nodes, c.nics, 100_000);
    for &(n, r, fail) in &c.faults {
        let nic = NicId::new(u32::from(n) % c.nodes as u32, u16::from(r) % c.nics as u16);
        if fail {
            let node = view.node(nic.node).unwrap();
            let alive = node.nics.iter().filter(|x| !x.is_failed()).count();
            if alive > 1 || c.nodes == 1 {
                view.set_failed(nic).unwrap();
            }
        } else {
            view.set_usable(nic, 50_000).unwrap();
        }
    }
    Fabric::new(layout, view).unwrap()
}

fn request(c: &Case, fab: &Fabric) -> ScheduleRequest {
    let p = c.p as u32;
    let op = ReduceOp::ALL[c.op];
    let coll = match c.coll {
        0 | 1 => Collective::AllReduce { op },
        2 => Collective::ReduceScatter { op },
        3 => Collective::AllGather,
        4 => Collective::Broadcast { root: Rank(c.a % p) },
        5 => Collective::Reduce { op, root: Rank(c.a % p) },
        6 => Collective::AlltoAll,
        _ => Collective::SendRecv { src: Rank(c.a % p), dst: Rank(c.b % p) },
    };
    let bw = r2ccl_algo::model::node_bandwidths(fab);
    let slowest = (0..bw.len()).min_by(|&x, &y| bw[x].total_cmp(&bw[y])).unwrap_or(0);
    let is_allreduce = matches!(coll, Collective::AllReduce { .. });
    let strat = if is_allreduce { c.strat } else { c.strat % 2 };
    let strategy = match strat {
        0 => Strat::Balance,
        1 => Strat::SingleBackup,
        2 => Strat::R2cclAllReduce(R2cclParams {
            degraded: NodeId(slowest as u32),
            tail_fraction: if c.tail { 0.25 } else { 0.5 },
            pipeline_chunks: c.k,
        }),
        3 => Strat::Recursive { pipeline_chunks: c.k },
        4 => Strat::FourStage,
        _ => Strat::FourStageDirect,
    };
    let algorithm = match (c.alg, coll) {
        (1, Collective::AllReduce { .. } | Collective::Broadcast { .. } | Collective::Reduce { .. }) => Algorithm::Tree,
        (2, Collective::AllReduce { .. }) => Algorithm::Hierarchical,
        (3, Collective::AllReduce { .. }) => Algorithm::Rails,
        _ => Algorithm::Ring,
    };
    let mut req = ScheduleRequest::new(coll, DType::ALL[c.dtype], c.count)
        .with_algorithm(algorithm)
        .with_strategy(strategy)
        .with_chunks(c.chunks);
    if let Some(s) = c.shuffle {
        let mut ring: Vec<Rank> = (0..p).map(Rank).collect();
        ring.sort_by_key(|r| (u64::from(r.0) + 1).wrapping_mul(s | 1).rotate_left(17));
        req = req.with_ring(ring);
    }
    req
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]
    #[test]
    fn schedules_are_exact_and_respect_health(c in case()) {
        let fab = fabric_of(&c);
        let req = request(&c, &fab);
        if let Err(e) = build_all(&fab, &req) {
            panic!("unexpected build error {e} for {req:?}");
        }
        let order = if c.p <= 12 { ExecOrder::Dataflow } else { ExecOrder::Program };
        let scheds = common::run_and_check(&fab, &req, c.seed, order);
        let layout = fab.layout();
        let mut inter = 0u64;
        for s in &scheds {
            let src_node = layout.node_of(s.rank).unwrap();
            for step in s.steps() {
                if let StepKind::Send { peer, src, split, .. } = step.kind {
                    let Some(sp) = s.split(split) else {
                        prop_assert_eq!(src_node, layout.node_of(peer).unwrap());
                        continue;
                    };
                    inter += src.len;
                    let dst_node = layout.node_of(peer).unwrap();
                    let elem = req.dtype.size() as u64;
                    let bytes = sp.divide(src.len, elem);
                    prop_assert_eq!(bytes.iter().sum::<u64>(), src.len);
                    for (i, (part, b)) in sp.parts.iter().zip(&bytes).enumerate() {
                        prop_assert!(fab.usable_mbps(src_node, part.src) > 0, "failed NIC used at the sender");
                        prop_assert!(fab.usable_mbps(dst_node, part.dst) > 0, "failed NIC used at the receiver");
                        let exact = sp.fraction(i) * (src.len / elem) as f64;
                        prop_assert!(((*b / elem) as f64 - exact).abs() <= 1.0, "part {} gets {} elements, weight says {}", i, b / elem, exact);
                    }
                }
            }
        }
        let traffic = Traffic::of(layout, &scheds).unwrap();
        prop_assert_eq!(traffic.total_inter_node(), inter);
    }
}
