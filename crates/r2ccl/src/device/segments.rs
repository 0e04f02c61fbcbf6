//! Device calls cut into segments that fit one staging slot: which bytes of the device buffers
//! each segment copies in and out, and the host work it runs there (pure: no IO, no clock).
//!
//! A segment of a collective is the same collective on a sub-range `[a, a + c)` of every block
//! (AllReduce, Broadcast and Reduce have one block; AllGather, ReduceScatter and AlltoAll one
//! per rank), laid out in its slot by NCCL's in-place convention, so the host collective runs
//! in place on registered memory with no copy. Every rank cuts a call the same way: the cut
//! depends only on the collective, its count, the world and the slot size.

use r2ccl_algo::{Collective, P2pOp};
use r2ccl_core::DType;

/// One contiguous copy between a device buffer and a staging slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Piece {
    /// Which device buffer: 0 the send (or the only) buffer, or a group operation's index.
    pub(crate) buf: usize,
    /// Byte offset in that device buffer.
    pub(crate) dev_off: u64,
    /// Which of the segment's slots (0, or 1 for a group's receive slot).
    pub(crate) slot: usize,
    /// Byte offset in the slot.
    pub(crate) slot_off: usize,
    /// Bytes.
    pub(crate) len: usize,
}

/// What a segment runs on the host, in its slot(s).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum HostWork {
    /// The collective on `count` elements, in place in slot 0 (`len` bytes of it).
    Coll { coll: Collective, count: u64, len: usize },
    /// The group: sends read from slot 0 (`in_len` bytes), receives written to slot 1.
    Group { ops: Vec<P2pOp>, in_len: usize, out_len: usize },
}

/// One segment: copy in, run, copy out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) work: HostWork,
    /// Device to slot, before the host work.
    pub(crate) stage_in: Vec<Piece>,
    /// Slot to device, after it.
    pub(crate) stage_out: Vec<Piece>,
}

impl Segment {
    /// How many slots it uses.
    pub(crate) const fn slots(&self) -> usize {
        match self.work {
            HostWork::Coll { .. } => 1,
            HostWork::Group { .. } => 2,
        }
    }
}

/// Why a device call cannot be cut.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CutError {
    /// Even one element (per block) does not fit a slot.
    #[error(
        "{what} needs {need} bytes of staging per segment; a slot holds {slot} (raise transport.device_staging_bytes)"
    )]
    SlotTooSmall { what: String, need: u64, slot: usize },
    /// The sizes overflow.
    #[error("{0} elements overflow the byte count")]
    Overflow(u64),
}

/// Cut collective `coll` of `count` elements of `dtype` on rank `rank` of `world` into segments
/// of at most `slot` staging bytes each.
pub(crate) fn cut_collective(
    coll: Collective,
    dtype: DType,
    count: u64,
    world: u32,
    rank: u32,
    slot: usize,
) -> Result<Vec<Segment>, CutError> {
    let e = dtype.size() as u64;
    let p = u64::from(world);
    let blocks = match coll {
        Collective::AllGather | Collective::ReduceScatter { .. } | Collective::AlltoAll => p,
        _ => 1,
    };
    let per_elem = blocks.checked_mul(e).ok_or(CutError::Overflow(count))?;
    count.checked_mul(per_elem).ok_or(CutError::Overflow(count))?;
    let fit = slot as u64 / per_elem;
    if fit == 0 && count > 0 {
        return Err(CutError::SlotTooSmall { what: coll.name().to_owned(), need: per_elem, slot });
    }
    let me = u64::from(rank);
    let mut segs = Vec::new();
    let mut a = 0u64;
    while a < count {
        let c = fit.min(count - a);
        let bytes = (c * e) as usize;
        let len = (c * per_elem) as usize;
        let piece =
            |dev_off: u64, slot_off: u64| Piece { buf: 0, dev_off, slot: 0, slot_off: slot_off as usize, len: bytes };
        // Block r of a buffer with `per` elements per block starts at r * per * e.
        let block = |r: u64, per: u64| piece((r * per + a) * e, r * c * e);
        let all_blocks = || (0..p).map(|r| block(r, count)).collect::<Vec<_>>();
        let (stage_in, stage_out) = match coll {
            Collective::AllReduce { .. } => (vec![piece(a * e, 0)], vec![piece(a * e, 0)]),
            Collective::Reduce { root, .. } => {
                (vec![piece(a * e, 0)], if root.0 == rank { vec![piece(a * e, 0)] } else { vec![] })
            }
            Collective::Broadcast { root } => {
                (if root.0 == rank { vec![piece(a * e, 0)] } else { vec![] }, vec![piece(a * e, 0)])
            }
            Collective::SendRecv { src, dst } => (
                if src.0 == rank { vec![piece(a * e, 0)] } else { vec![] },
                if dst.0 == rank { vec![piece(a * e, 0)] } else { vec![] },
            ),
            Collective::AllGather => (vec![piece(a * e, me * c * e)], all_blocks()),
            Collective::ReduceScatter { .. } => (all_blocks(), vec![piece(a * e, me * c * e)]),
            Collective::AlltoAll => (all_blocks(), all_blocks()),
        };
        segs.push(Segment { work: HostWork::Coll { coll, count: c, len }, stage_in, stage_out });
        a += c;
    }
    Ok(segs)
}

/// A group of point-to-point operations as one segment: sends packed into slot 0 in their
/// order, receives unpacked from slot 1 (operation `i` is device buffer `i`).
pub(crate) fn cut_group(dtype: DType, ops: &[P2pOp], slot: usize) -> Result<Segment, CutError> {
    let e = dtype.size() as u64;
    let (mut stage_in, mut stage_out) = (Vec::new(), Vec::new());
    let (mut in_len, mut out_len) = (0u64, 0u64);
    for (i, op) in ops.iter().enumerate() {
        let (count, at, list, which) = match op {
            P2pOp::Send { count, .. } => (*count, &mut in_len, &mut stage_in, 0),
            P2pOp::Recv { count, .. } => (*count, &mut out_len, &mut stage_out, 1),
        };
        let len = count.checked_mul(e).ok_or(CutError::Overflow(count))?;
        let end = at.checked_add(len).ok_or(CutError::Overflow(count))?;
        if end > slot as u64 {
            return Err(CutError::SlotTooSmall { what: "a device group's sends or receives".into(), need: end, slot });
        }
        list.push(Piece { buf: i, dev_off: 0, slot: which, slot_off: *at as usize, len: len as usize });
        *at = end;
    }
    Ok(Segment {
        work: HostWork::Group { ops: ops.to_vec(), in_len: in_len as usize, out_len: out_len as usize },
        stage_in,
        stage_out,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use r2ccl_core::{Rank, ReduceOp};

    /// Run `coll` segment by segment on host "device" buffers with a reference executor that
    /// applies the in-place collective to every rank's slot; compare with the whole call.
    #[allow(clippy::needless_range_loop, reason = "indexes several per-rank tables at once")]
    fn simulate(coll: Collective, count: u64, world: u32, slot: usize) -> Vec<Vec<u32>> {
        let p = world as usize;
        let n = count as usize;
        let (in_n, out_n) = match coll {
            Collective::AllGather => (n, p * n),
            Collective::ReduceScatter { .. } => (p * n, n),
            Collective::AlltoAll => (p * n, p * n),
            _ => (n, n),
        };
        let sends: Vec<Vec<u32>> = (0..p).map(|r| (0..in_n).map(|i| (r * 1000 + i) as u32).collect()).collect();
        let mut recvs: Vec<Vec<u32>> = vec![vec![u32::MAX; out_n]; p];
        let cuts: Vec<Vec<Segment>> =
            (0..world).map(|r| cut_collective(coll, DType::U32, count, world, r, slot).expect("cut")).collect();
        let nseg = cuts[0].len();
        assert!(cuts.iter().all(|c| c.len() == nseg), "every rank cuts alike");
        for s in 0..nseg {
            let HostWork::Coll { count: c, len, .. } = cuts[0][s].work else { panic!("coll") };
            let c = c as usize;
            let mut slots: Vec<Vec<u32>> = vec![vec![0; len / 4]; p];
            for r in 0..p {
                for pc in &cuts[r][s].stage_in {
                    let at = pc.dev_off as usize / 4;
                    slots[r][pc.slot_off / 4..(pc.slot_off + pc.len) / 4]
                        .copy_from_slice(&sends[r][at..at + pc.len / 4]);
                }
            }
            let before = slots.clone();
            for r in 0..p {
                let out = &mut slots[r];
                match coll {
                    Collective::AllReduce { .. } | Collective::Reduce { .. } => {
                        for i in 0..c {
                            out[i] = (0..p).map(|q| before[q][i]).sum();
                        }
                    }
                    Collective::Broadcast { root } => out.copy_from_slice(&before[root.0 as usize]),
                    Collective::AllGather => {
                        for q in 0..p {
                            out[q * c..(q + 1) * c].copy_from_slice(&before[q][q * c..(q + 1) * c]);
                        }
                    }
                    Collective::ReduceScatter { .. } => {
                        for i in 0..c {
                            out[r * c + i] = (0..p).map(|q| before[q][r * c + i]).sum();
                        }
                    }
                    Collective::AlltoAll => {
                        for q in 0..p {
                            out[q * c..(q + 1) * c].copy_from_slice(&before[q][r * c..(r + 1) * c]);
                        }
                    }
                    Collective::SendRecv { .. } => unreachable!(),
                }
            }
            for r in 0..p {
                for pc in &cuts[r][s].stage_out {
                    let at = pc.dev_off as usize / 4;
                    recvs[r][at..at + pc.len / 4]
                        .copy_from_slice(&slots[r][pc.slot_off / 4..(pc.slot_off + pc.len) / 4]);
                }
            }
        }
        recvs
    }

    /// The collective's definition, on the same inputs as `simulate`.
    fn reference(coll: Collective, count: u64, world: u32) -> Vec<Vec<u32>> {
        let (p, n) = (world as usize, count as usize);
        let send = |q: usize, i: usize| (q * 1000 + i) as u32;
        (0..p)
            .map(|r| match coll {
                Collective::AllReduce { .. } => (0..n).map(|i| (0..p).map(|q| send(q, i)).sum()).collect(),
                Collective::Reduce { root, .. } if root.0 as usize == r => {
                    (0..n).map(|i| (0..p).map(|q| send(q, i)).sum()).collect()
                }
                Collective::Reduce { .. } => vec![u32::MAX; n],
                Collective::Broadcast { root } => (0..n).map(|i| send(root.0 as usize, i)).collect(),
                Collective::AllGather => (0..p * n).map(|j| send(j / n.max(1), j % n.max(1))).collect(),
                Collective::ReduceScatter { .. } => (0..n).map(|i| (0..p).map(|q| send(q, r * n + i)).sum()).collect(),
                Collective::AlltoAll => (0..p * n).map(|j| send(j / n.max(1), r * n + j % n.max(1))).collect(),
                Collective::SendRecv { .. } => unreachable!(),
            })
            .collect()
    }

    proptest! {
        #[test]
        fn segments_compose_to_the_whole_collective(
            which in 0usize..6, count in 0u64..40, world in 1u32..5, slot_elems in 1usize..50,
        ) {
            let colls = [
                Collective::AllReduce { op: ReduceOp::Sum },
                Collective::Reduce { op: ReduceOp::Sum, root: Rank(world - 1) },
                Collective::Broadcast { root: Rank(world / 2) },
                Collective::AllGather,
                Collective::ReduceScatter { op: ReduceOp::Sum },
                Collective::AlltoAll,
            ];
            let coll = colls[which];
            let blocks = if which >= 3 { world as usize } else { 1 };
            let slot = (slot_elems * 4 * blocks).max(4 * blocks);
            prop_assert_eq!(simulate(coll, count, world, slot), reference(coll, count, world));
            let segs = cut_collective(coll, DType::U32, count, world, 0, slot).unwrap();
            let fits = segs.iter().all(|s| matches!(s.work, HostWork::Coll { len, .. } if len <= slot));
            prop_assert!(fits);
        }
    }

    #[test]
    fn a_slot_too_small_for_one_element_per_block_is_a_named_error() {
        let e = cut_collective(Collective::AllGather, DType::F64, 10, 8, 0, 32).unwrap_err();
        assert_eq!(e, CutError::SlotTooSmall { what: "allgather".into(), need: 64, slot: 32 });
        assert!(e.to_string().contains("transport.device_staging_bytes"), "{e}");
    }

    #[test]
    fn a_group_packs_sends_and_receives_in_order() {
        let ops = [
            P2pOp::Send { peer: Rank(1), count: 3 },
            P2pOp::Recv { peer: Rank(1), count: 2 },
            P2pOp::Send { peer: Rank(2), count: 1 },
        ];
        let s = cut_group(DType::U32, &ops, 64).unwrap();
        assert_eq!(s.work, HostWork::Group { ops: ops.to_vec(), in_len: 16, out_len: 8 });
        assert_eq!(
            s.stage_in,
            vec![
                Piece { buf: 0, dev_off: 0, slot: 0, slot_off: 0, len: 12 },
                Piece { buf: 2, dev_off: 0, slot: 0, slot_off: 12, len: 4 }
            ]
        );
        assert_eq!(s.stage_out, vec![Piece { buf: 1, dev_off: 0, slot: 1, slot_off: 0, len: 8 }]);
        assert!(matches!(cut_group(DType::U32, &ops, 8), Err(CutError::SlotTooSmall { .. })));
    }
}
