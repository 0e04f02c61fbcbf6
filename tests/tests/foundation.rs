//! Cross-crate checks of the foundation: config feeds logging; health-view agreement.
#![allow(clippy::unwrap_used, reason = "a panic here is a test failure with a message")]

use proptest::prelude::*;
use r2ccl_core::{HealthEpoch, HealthView, NicId};

#[test]
fn loaded_config_yields_a_valid_log_spec() {
    let cfg = r2ccl_config::load_from([("R2CCL_DEBUG", "INFO"), ("R2CCL_DEBUG_SUBSYS", "^SIM")]).unwrap();
    let spec = r2ccl_log::LogSpec::parse(&cfg.log.level, &cfg.log.subsys, &cfg.log.file).unwrap();
    assert_eq!(spec.level, r2ccl_log::LogSpec::parse("INFO", "ALL", "").unwrap().level);
    assert!(!spec.targets.contains(&r2ccl_core::subsys::SIM));
    assert!(spec.targets.contains(&r2ccl_core::subsys::NET));
}

proptest! {
    /// Every rank merges the same local views in its own order; all must agree on the
    /// merged view and its digest (MECHANISMS.md section 4).
    #[test]
    fn merged_view_is_independent_of_merge_order(
        nodes in 1usize..8,
        nics in 1usize..5,
        failures in prop::collection::vec((0usize..8, 0usize..5, 0u8..3), 0..12),
        order in prop::collection::vec(any::<prop::sample::Index>(), 1..6),
    ) {
        let base = HealthView::uniform(nodes, nics, 100_000);
        let locals: Vec<HealthView> = order.iter().enumerate().map(|(i, _)| {
            let mut v = base.clone();
            v.set_epoch(HealthEpoch(i as u64));
            for &(n, r, kind) in failures.iter().skip(i).step_by(order.len()) {
                let nic = NicId::new((n % nodes) as u32, (r % nics) as u16);
                if kind == 0 { v.set_failed(nic).unwrap() } else { v.set_usable(nic, 25_000 * u64::from(kind)).unwrap() }
            }
            v
        }).collect();
        let mut forward = base.clone();
        for v in &locals { forward.merge_from(v).unwrap(); }
        let mut backward = base.clone();
        for i in order.iter().rev() { backward.merge_from(&locals[i.index(locals.len())]).unwrap(); }
        for v in &locals { backward.merge_from(v).unwrap(); }
        prop_assert_eq!(forward.digest(), backward.digest());
        prop_assert_eq!(&forward, &backward);
    }
}
