//! The cluster view merged from every rank's local view.
#![allow(clippy::unwrap_used, reason = "tests: a panic is a test failure with a message")]

use r2ccl_core::{NodeId, Rank};
use r2ccl_topo::{load_cluster_file, ClusterTopology, LocalView, MergeError, ValidationError};
use std::path::PathBuf;

fn small() -> ClusterTopology {
    load_cluster_file(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs/topo/small-2gpu-3nic.toml"))
        .unwrap()
}

/// The local views the ranks of `c` would report, with host keys `host-<node>`.
fn views(c: &ClusterTopology) -> Vec<LocalView> {
    c.ranks()
        .iter()
        .map(|p| LocalView {
            rank: p.rank,
            host_key: format!("host-{}", p.node.0),
            gpu: p.gpu,
            numa: None,
            node: c.node(p.node).unwrap().clone(),
        })
        .collect()
}

#[test]
fn merge_rebuilds_the_cluster_in_any_order() {
    let c = small();
    let mut v = views(&c);
    let merged = ClusterTopology::merge(&v).unwrap();
    v.reverse();
    v.swap(0, 3);
    assert_eq!(ClusterTopology::merge(&v).unwrap(), merged);
    assert_eq!((merged.nodes().len(), merged.ranks().len(), merged.rails()), (3, 6, 3));
    assert_eq!(merged.nodes()[2].hostname, "host-2");
    for (a, b) in merged.ranks().iter().zip(c.ranks()) {
        assert_eq!((a.rank, a.node, a.gpu, a.numa), (b.rank, b.node, b.gpu, b.numa), "numa from the GPU");
    }
    assert_eq!(merged.nic_selections(), c.nic_selections());
}

#[test]
fn nodes_are_numbered_by_their_lowest_rank() {
    let c = small();
    let mut v = views(&c);
    // Interleave: ranks 0, 2, 4 on host-x; 1, 3, 5 on host-y.
    for view in &mut v {
        view.host_key = if view.rank.0 % 2 == 0 { "host-x".into() } else { "host-y".into() };
        view.gpu = Some(0);
        view.node = c.nodes()[0].clone();
    }
    let m = ClusterTopology::merge(&v).unwrap();
    assert_eq!(m.nodes().len(), 2);
    assert_eq!(m.ranks_on(NodeId(0)).collect::<Vec<_>>(), vec![Rank(0), Rank(2), Rank(4)]);
    assert_eq!(m.nodes()[1].hostname, "host-y");
}

#[test]
fn conflicting_or_broken_views_are_rejected() {
    let c = small();
    let mut v = views(&c);
    v[3].node.nics[0].speed_mbps = 25_000;
    assert_eq!(
        ClusterTopology::merge(&v).unwrap_err(),
        MergeError::ConflictingViews { host: "host-1".into(), first: 2, rank: 3 }
    );
    let mut v = views(&c);
    v.remove(4);
    assert!(matches!(
        ClusterTopology::merge(&v).unwrap_err(),
        MergeError::Invalid(ValidationError::OutOfRange { .. } | ValidationError::MissingRank { .. })
    ));
    let mut v = views(&c);
    v[1].rank = Rank(0);
    assert!(matches!(ClusterTopology::merge(&v), Err(MergeError::Invalid(ValidationError::DuplicateRank { .. }))));
    let mut v = views(&c);
    for x in v.iter_mut().filter(|x| x.host_key == "host-2") {
        x.node.nics.pop();
    }
    assert!(matches!(
        ClusterTopology::merge(&v),
        Err(MergeError::Invalid(ValidationError::MissingRail { rail: 2, .. }))
    ));
    assert_eq!(ClusterTopology::merge(&[]).unwrap_err(), MergeError::Empty);
}

#[test]
fn local_views_travel_as_json() {
    let v = views(&small());
    let text = serde_json::to_string(&v).unwrap();
    let back: Vec<LocalView> = serde_json::from_str(&text).unwrap();
    assert_eq!(back, v);
}
