//! What the communicator's planner predicts for a testbed run: the library's own
//! [`r2ccl_policy::Planner`], built as a communicator builds it (from r2ccl-topo's cluster model)
//! and called in process by the bench's strategies part and the e2e judge.

use anyhow::{Context, Result};
use r2ccl_core::{DType, NicId, NodeId, Rank, ReduceOp};
use r2ccl_policy::{Collective, Planner};
use r2ccl_topo::{ClusterTopology, NodeTopology};

/// The planner's prediction for one AllReduce.
#[derive(Clone, Debug, PartialEq)]
pub struct Prediction {
    /// Fault-free time, s.
    pub t_nf: f64,
    /// The lower bound on the degraded fabric, s.
    pub lower_bound: f64,
    /// Every candidate the planner weighed, by name, with its predicted time, s.
    pub times: Vec<(String, f64)>,
    /// The candidate it chose.
    pub chosen: String,
}

impl Prediction {
    /// The predicted time of the candidate named `name`.
    pub fn time_of(&self, name: &str) -> Option<f64> {
        self.times.iter().find(|(n, _)| n == name).map(|&(_, t)| t)
    }
}

/// The communicator planner's model plan of a `bytes` AllReduce (U8 elements) on `nodes` nodes of
/// `nics` NICs at `gbps` (payload line rate), `ranks_per_node` ranks on each, ranks numbered node
/// by node, with the NICs `failed` (node, rail) down.
pub fn allreduce(
    nodes: u32,
    nics: u32,
    ranks_per_node: u32,
    gbps: f64,
    failed: &[(u32, u16)],
    bytes: u64,
) -> Result<Prediction> {
    let mbps = ((gbps * 1000.0).round() as u64).max(1);
    let names: Vec<String> = (0..nics).map(|r| format!("eth{r}")).collect();
    let facts: Vec<(&str, u64, Option<u32>)> = names.iter().map(|n| (n.as_str(), mbps, None)).collect();
    let hosts = (0..nodes).map(|n| NodeTopology::from_nics(format!("node{n}"), &facts)).collect();
    let placement: Vec<NodeId> = (0..nodes * ranks_per_node).map(|r| NodeId(r / ranks_per_node.max(1))).collect();
    let cluster = ClusterTopology::with_ranks_on(None, hosts, &placement).context("the testbed's cluster model")?;
    let planner = Planner::for_communicator(Rank(0), &cluster, true, "auto")?;
    let mut view = cluster.health_view();
    for &(node, rail) in failed {
        view.set_failed(NicId::new(node, rail)).with_context(|| format!("NIC {node}:{rail}"))?;
    }
    let plan = planner
        .model_plan(&view, Collective::AllReduce { op: ReduceOp::Sum }, DType::U8, bytes)
        .context("the cost model does not cover this layout")??;
    Ok(Prediction {
        t_nf: plan.t_nf_s,
        lower_bound: plan.lower_bound_s,
        times: plan.candidates.iter().map(|c| (c.strategy.name().to_owned(), c.time_s)).collect(),
        chosen: plan.chosen.name().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_nic_down_costs_time_and_the_choice_has_a_prediction() {
        let healthy = allreduce(4, 2, 1, 1.0, &[], 64 << 20).unwrap();
        let degraded = allreduce(4, 2, 1, 1.0, &[(1, 0)], 64 << 20).unwrap();
        assert!(degraded.lower_bound > healthy.lower_bound);
        let t = degraded.time_of(&degraded.chosen).unwrap();
        assert!(t >= degraded.lower_bound && degraded.t_nf > 0.0, "{degraded:?}");
        assert!(allreduce(4, 2, 1, 1.0, &[(9, 0)], 1 << 20).is_err(), "a NIC the fabric lacks");
    }

    /// The bench's and the e2e judge's figures are what `r2ccl-plan --communicator` prints: the
    /// same plan from the uniform topology the binary builds.
    #[test]
    fn the_planner_predicts_what_r2ccl_plan_prints() {
        use r2ccl_policy::{communicator_topology, plan_bridging_splits, Topology};
        for (nodes, nics, rpn, failed) in
            [(4, 2, 1, vec![(1, 0)]), (3, 2, 1, vec![(1, 0), (2, 1)]), (4, 3, 2, vec![(0, 2)])]
        {
            let got = allreduce(nodes, nics, rpn, 0.04, &failed, 64 << 20).unwrap();
            let shape = Topology::uniform(nodes as usize, nics as usize, 40).unwrap().with_ranks_per_node(rpn).unwrap();
            let topo = communicator_topology(shape, true).unwrap();
            let mut view = r2ccl_core::HealthView::uniform(nodes as usize, nics as usize, 40);
            for &(n, r) in &failed {
                view.set_failed(NicId::new(n, r)).unwrap();
            }
            let (want, _) =
                plan_bridging_splits(&topo, &view, Collective::AllReduce { op: ReduceOp::Sum }, DType::U8, 64 << 20)
                    .unwrap();
            assert_eq!(
                (got.t_nf, got.lower_bound, got.chosen.as_str()),
                (want.t_nf_s, want.lower_bound_s, want.chosen.name())
            );
        }
    }
}
