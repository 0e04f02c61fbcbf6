//! Grouped point-to-point (NCCL's `ncclGroupStart`/`ncclGroupEnd` around `ncclSend`/`ncclRecv`):
//! one rank's schedule for a list of sends and receives to arbitrary peers, all in flight at once.

use super::{Cx, Elems, ScheduleBuilder};
use crate::layout::{Fabric, RailMask};
use crate::schedule::{Buf, RankSchedule, Tag};
use crate::spec::Strategy;
use crate::AlgoError;
use r2ccl_core::{DType, Rank, ReduceOp};

/// One operation of a point-to-point group, in the caller's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum P2pOp {
    /// Send `count` elements to `peer`.
    Send {
        /// The receiver.
        peer: Rank,
        /// Elements.
        count: u64,
    },
    /// Receive `count` elements from `peer`.
    Recv {
        /// The sender.
        peer: Rank,
        /// Elements.
        count: u64,
    },
}

impl P2pOp {
    /// The other rank.
    pub const fn peer(&self) -> Rank {
        match *self {
            Self::Send { peer, .. } | Self::Recv { peer, .. } => peer,
        }
    }

    /// Elements moved.
    pub const fn count(&self) -> u64 {
        match *self {
            Self::Send { count, .. } | Self::Recv { count, .. } => count,
        }
    }

    /// Whether this is a send.
    pub const fn is_send(&self) -> bool {
        matches!(self, Self::Send { .. })
    }
}

/// Input and output buffer lengths (bytes) of a group: the sends' payloads back to back in
/// operation order, and the receives' buffers back to back in operation order.
pub fn p2p_group_lens(dtype: DType, ops: &[P2pOp]) -> Result<(u64, u64), AlgoError> {
    let elem = dtype.size() as u64;
    let mut lens = (0u64, 0u64);
    for op in ops {
        let bytes =
            op.count().checked_mul(elem).ok_or(AlgoError::SizeOverflow { count: op.count(), factor: 1, elem })?;
        let total = if op.is_send() { &mut lens.0 } else { &mut lens.1 };
        *total = total.checked_add(bytes).ok_or(AlgoError::SizeOverflow { count: op.count(), factor: 1, elem })?;
    }
    Ok(lens)
}

/// `rank`'s schedule for a point-to-point group on `fabric`.
///
/// The k-th send from A to B matches B's k-th receive from A (the facade checks across ranks
/// that their counts agree). A send to oneself matches a receive from oneself in the same way
/// and becomes a local copy. Inter-node transfers are split over the NICs by the fabric's
/// Balance weights. Errors: a peer outside the communicator, or self-sends and self-receives
/// that do not pair up with equal counts.
pub fn build_p2p_group(fabric: &Fabric, rank: Rank, dtype: DType, ops: &[P2pOp]) -> Result<RankSchedule, AlgoError> {
    let layout = fabric.layout();
    layout.check_rank(rank)?;
    for op in ops {
        layout.check_rank(op.peer())?;
    }
    let (input_len, output_len) = p2p_group_lens(dtype, ops)?;
    let mut cx = Cx {
        fab: fabric,
        me: rank,
        elem: dtype.size() as u64,
        chunks: 1,
        policy: Strategy::Balance.rail_policy(),
        b: ScheduleBuilder::new(rank, layout.ranks() as u32, dtype, ReduceOp::Sum, input_len, output_len),
        phase: 0,
        split_cache: Vec::new(),
    };
    let ph = cx.phase();
    let (mut in_off, mut out_off) = (0u64, 0u64);
    // Per peer: how many sends and receives so far (the k-th of each pairs with the peer's k-th).
    let mut sent = vec![0u32; layout.ranks()];
    let mut received = vec![0u32; layout.ranks()];
    let mut self_sends: Vec<Elems> = Vec::new();
    let mut self_recvs: Vec<Elems> = Vec::new();
    // Sends first, then receives (buffer offsets still follow the caller's order): every step
    // is independent, and this keeps program order a valid execution order (sends never wait).
    let sends_first = ops.iter().filter(|o| o.is_send()).chain(ops.iter().filter(|o| !o.is_send()));
    for op in sends_first {
        let peer = op.peer();
        let n = op.count();
        if op.is_send() {
            let src = Elems::new(Buf::Input, in_off, n);
            in_off += n;
            if peer == rank {
                self_sends.push(src);
            } else {
                let k = &mut sent[peer.index()];
                cx.send(peer, Tag::new(ph, *k, 0), src, RailMask::ALL, &[])?;
                *k += 1;
            }
        } else {
            let dst = Elems::new(Buf::Output, out_off, n);
            out_off += n;
            if peer == rank {
                self_recvs.push(dst);
            } else {
                let k = &mut received[peer.index()];
                cx.recv(peer, Tag::new(ph, *k, 0), dst, false, RailMask::ALL)?;
                *k += 1;
            }
        }
    }
    if self_sends.len() != self_recvs.len() {
        return Err(AlgoError::InvalidParameter {
            name: "ops",
            value: format!("{} sends to self, {} receives from self", self_sends.len(), self_recvs.len()),
            why: "each send to oneself needs a matching receive from oneself",
        });
    }
    for (src, dst) in self_sends.into_iter().zip(self_recvs) {
        if src.len != dst.len {
            return Err(AlgoError::InvalidParameter {
                name: "ops",
                value: format!("send to self of {} elements, receive of {}", src.len, dst.len),
                why: "a send to oneself and its receive must have the same count",
            });
        }
        cx.copy(src, dst);
    }
    Ok(cx.b.finish())
}
