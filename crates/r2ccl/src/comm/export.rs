//! What a communicator exports to its metrics series (`crate::metrics::CommMetrics`) from its
//! transport and health view.

use super::setup::Progress;
use crate::oob::Channel;
use r2ccl_core::{HealthView, NicId};

impl Progress {
    /// Add the OOB messages sent since the last call to `r2ccl_oob_messages_total` and to
    /// [`crate::Communicator::oob_messages_sent`].
    pub(super) fn export_oob_messages(&mut self) {
        for (i, c) in Channel::ALL.into_iter().enumerate() {
            let now = self.mesh.sent(c);
            let before = std::mem::replace(&mut self.oob_sent_seen[i], now);
            self.metrics.oob_messages(c.name(), now.saturating_sub(before));
            self.shared.oob_sent[i].store(now, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// Add the bytes each local NIC moved since the last call to `r2ccl_nic_bytes_total`.
    pub(super) fn export_nic_bytes(&mut self) {
        let now = self.transport.nic_bytes();
        for (r, &(tx, rx)) in now.iter().enumerate() {
            let (ptx, prx) = self.nic_bytes_seen.get(r).copied().unwrap_or((0, 0));
            self.metrics.nic_bytes(r as u16, true, tx.saturating_sub(ptx));
            self.metrics.nic_bytes(r as u16, false, rx.saturating_sub(prx));
        }
        self.nic_bytes_seen = now;
    }

    /// Export a NIC's state, if it is one of this rank's node's (each rank exports its own
    /// node's NICs only).
    pub(super) fn export_nic_up(&self, nic: NicId, up: bool) {
        let mine = self.node_of.get(self.rank as usize).copied().unwrap_or(0);
        if nic.node.0 == mine {
            self.metrics.nic_up(nic.rail.0, up);
        }
    }

    /// Export the nominal and usable bandwidth of this node's NICs in `view`.
    pub(super) fn export_nic_capacity(&self, view: &HealthView) {
        let mine = self.node_of.get(self.rank as usize).copied().unwrap_or(0);
        if let Some(node) = view.nodes().get(mine as usize) {
            for (r, nic) in node.nics.iter().enumerate() {
                self.metrics.nic_capacity(r as u16, nic.nominal_mbps, nic.usable_mbps);
            }
        }
    }
}
