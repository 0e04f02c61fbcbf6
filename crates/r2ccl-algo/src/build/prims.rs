//! Building blocks: ring reduce-scatter / all-gather over any rank group and any
//! segment map, chains, binomial trees, recursive doubling, pairwise AlltoAll.

use super::{Cx, Elems};
use crate::layout::RailMask;
use crate::schedule::{Buf, Tag};
use crate::AlgoError;
use r2ccl_core::Rank;

fn position(group: &[Rank], me: Rank) -> Option<usize> {
    group.iter().position(|&r| r == me)
}

/// Ring reduce-scatter among `group` (in ring order): afterwards the member at position
/// `i` holds the reduction of segment `seg(i)` over all members. Segments are chunked
/// into `cx.chunks` messages per step.
pub(crate) fn ring_rs(
    cx: &mut Cx<'_>,
    group: &[Rank],
    seg: &dyn Fn(usize) -> Elems,
    mask: RailMask,
) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let s = group.len();
    let Some(pos) = position(group, cx.me) else { return Ok(()) };
    if s < 2 {
        return Ok(());
    }
    let (next, prev) = (group[(pos + 1) % s], group[(pos + s - 1) % s]);
    let chunks = u64::from(cx.chunks);
    for t in 0..s - 1 {
        let send_seg = seg((pos + 2 * s - t - 1) % s);
        let recv_seg = seg((pos + 2 * s - t - 2) % s);
        for c in 0..chunks {
            let tag = Tag::new(ph, t as u32, c as u32);
            cx.send(next, tag, send_seg.part(chunks, c), mask, &[])?;
            cx.recv(prev, tag, recv_seg.part(chunks, c), true, mask)?;
        }
    }
    Ok(())
}

/// Ring all-gather among `group`: the member at position `i` starts with segment
/// `seg(i)`; afterwards every member holds every segment.
pub(crate) fn ring_ag(
    cx: &mut Cx<'_>,
    group: &[Rank],
    seg: &dyn Fn(usize) -> Elems,
    mask: RailMask,
) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let s = group.len();
    let Some(pos) = position(group, cx.me) else { return Ok(()) };
    if s < 2 {
        return Ok(());
    }
    let (next, prev) = (group[(pos + 1) % s], group[(pos + s - 1) % s]);
    let chunks = u64::from(cx.chunks);
    for t in 0..s - 1 {
        let send_seg = seg((pos + s - t) % s);
        let recv_seg = seg((pos + 2 * s - t - 1) % s);
        for c in 0..chunks {
            let tag = Tag::new(ph, t as u32, c as u32);
            cx.send(next, tag, send_seg.part(chunks, c), mask, &[])?;
            cx.recv(prev, tag, recv_seg.part(chunks, c), false, mask)?;
        }
    }
    Ok(())
}

/// Direct reduce-scatter among `group`: each member sends segment `seg(j)` of its buffer
/// straight to the member at position `j` and reduces what the others send into its own
/// segment, so afterwards the member at position `i` holds `seg(i)` reduced over all members,
/// after one hop instead of a ring's `s - 1` (for a switched intra-node fabric, where every
/// pair has its own path). Segments are chunked into `cx.chunks` messages per pair.
pub(crate) fn direct_rs(
    cx: &mut Cx<'_>,
    group: &[Rank],
    seg: &dyn Fn(usize) -> Elems,
    mask: RailMask,
) -> Result<(), AlgoError> {
    direct_exchange(cx, group, seg, mask, true)
}

/// Direct all-gather among `group`: each member sends its segment `seg(i)` straight to every
/// other member (one hop), in the rounds of [`direct_rs`].
pub(crate) fn direct_ag(
    cx: &mut Cx<'_>,
    group: &[Rank],
    seg: &dyn Fn(usize) -> Elems,
    mask: RailMask,
) -> Result<(), AlgoError> {
    direct_exchange(cx, group, seg, mask, false)
}

/// One hop between every pair of `group`: in round `d` a member sends to the member `d`
/// positions ahead and receives from the one `d` behind (so program order stays valid).
/// Reduce-scatter (`reduce`): it sends the receiver's segment and reduces into its own;
/// all-gather: it sends its own segment and receives the sender's.
fn direct_exchange(
    cx: &mut Cx<'_>,
    group: &[Rank],
    seg: &dyn Fn(usize) -> Elems,
    mask: RailMask,
    reduce: bool,
) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let s = group.len();
    let Some(pos) = position(group, cx.me) else { return Ok(()) };
    let chunks = u64::from(cx.chunks);
    for c in 0..chunks {
        for d in 1..s {
            let (to, from) = ((pos + d) % s, (pos + s - d) % s);
            let (out, into) = if reduce { (seg(to), seg(pos)) } else { (seg(pos), seg(from)) };
            let tag = Tag::new(ph, 0, c as u32);
            cx.send(group[to], tag, out.part(chunks, c), mask, &[])?;
            cx.recv(group[from], tag, into.part(chunks, c), reduce, mask)?;
        }
    }
    Ok(())
}

/// Ring AllReduce of `region` (already holding each member's contribution) among `group`.
pub(crate) fn ring_allreduce(cx: &mut Cx<'_>, group: &[Rank], region: Elems, mask: RailMask) -> Result<(), AlgoError> {
    let s = group.len() as u64;
    let seg = move |i: usize| region.part(s, i as u64);
    ring_rs(cx, group, &seg, mask)?;
    ring_ag(cx, group, &seg, mask)
}

/// ReduceScatter: ring over the ranks in ring order, blocks in rank order, in scratch.
pub(crate) fn reduce_scatter(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    let p = ring.len() as u64;
    let me = u64::from(cx.me.0);
    let scratch = Elems::new(Buf::Scratch, 0, p * n);
    cx.b.set_scratch(p * n * cx.elem);
    cx.copy(Elems::new(Buf::Input, 0, p * n), scratch);
    let seg = |i: usize| Elems::new(Buf::Scratch, u64::from(ring[i].0) * n, n);
    ring_rs(cx, ring, &seg, RailMask::ALL)?;
    cx.copy(Elems::new(Buf::Scratch, me * n, n), Elems::new(Buf::Output, 0, n));
    Ok(())
}

/// AllGather: ring over the ranks in ring order, blocks in rank order.
pub(crate) fn all_gather(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    let me = u64::from(cx.me.0);
    cx.copy(Elems::new(Buf::Input, 0, n), Elems::new(Buf::Output, me * n, n));
    let seg = |i: usize| Elems::new(Buf::Output, u64::from(ring[i].0) * n, n);
    ring_ag(cx, ring, &seg, RailMask::ALL)
}

/// Pipelined chain from `chain[0]` to the last member: every member ends with
/// `chain[0]`'s `region` (the head must already hold it).
pub(crate) fn chain_copy(cx: &mut Cx<'_>, chain: &[Rank], region: Elems, mask: RailMask) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let Some(q) = position(chain, cx.me) else { return Ok(()) };
    let chunks = u64::from(cx.chunks);
    for c in 0..chunks {
        let tag = Tag::new(ph, 0, c as u32);
        let piece = region.part(chunks, c);
        if q > 0 {
            cx.recv(chain[q - 1], tag, piece, false, mask)?;
        }
        if q + 1 < chain.len() {
            cx.send(chain[q + 1], tag, piece, mask, &[])?;
        }
    }
    Ok(())
}

/// Pipelined chain reduction towards the last member of `chain` (every member's
/// `region` holds its contribution; the last ends with the reduction).
pub(crate) fn chain_reduce_to_last(
    cx: &mut Cx<'_>,
    chain: &[Rank],
    region: Elems,
    mask: RailMask,
) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let Some(q) = position(chain, cx.me) else { return Ok(()) };
    let chunks = u64::from(cx.chunks);
    for c in 0..chunks {
        let tag = Tag::new(ph, 0, c as u32);
        let piece = region.part(chunks, c);
        if q > 0 {
            cx.recv(chain[q - 1], tag, piece, true, mask)?;
        }
        if q + 1 < chain.len() {
            cx.send(chain[q + 1], tag, piece, mask, &[])?;
        }
    }
    Ok(())
}

fn rotate(ring: &[Rank], root: Rank, offset: usize) -> Vec<Rank> {
    let p = ring.len();
    let rp = position(ring, root).unwrap_or(0);
    (0..p).map(|q| ring[(rp + offset + q) % p]).collect()
}

/// Broadcast as a pipelined chain along the ring starting at the root.
pub(crate) fn chain_broadcast(cx: &mut Cx<'_>, ring: &[Rank], root: Rank, n: u64) -> Result<(), AlgoError> {
    let out = Elems::new(Buf::Output, 0, n);
    if cx.me == root {
        cx.copy(Elems::new(Buf::Input, 0, n), out);
    }
    let chain = rotate(ring, root, 0);
    chain_copy(cx, &chain, out, RailMask::ALL)
}

/// Reduce as a pipelined chain along the ring ending at the root.
pub(crate) fn chain_reduce(cx: &mut Cx<'_>, ring: &[Rank], root: Rank, n: u64) -> Result<(), AlgoError> {
    let out = Elems::new(Buf::Output, 0, n);
    cx.copy(Elems::new(Buf::Input, 0, n), out);
    let chain = rotate(ring, root, 1);
    chain_reduce_to_last(cx, &chain, out, RailMask::ALL)
}

fn lowbit(v: usize, p: usize) -> usize {
    if v == 0 {
        p.next_power_of_two()
    } else {
        v & v.wrapping_neg()
    }
}

/// Binomial-tree broadcast (relative ranks along the ring, rooted at `root`).
pub(crate) fn tree_broadcast(cx: &mut Cx<'_>, ring: &[Rank], root: Rank, n: u64) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let order = rotate(ring, root, 0);
    let p = order.len();
    let v = position(&order, cx.me).unwrap_or(0);
    let out = Elems::new(Buf::Output, 0, n);
    let chunks = u64::from(cx.chunks);
    if v == 0 {
        cx.copy(Elems::new(Buf::Input, 0, n), out);
    }
    let lb = lowbit(v, p);
    for c in 0..chunks {
        let tag = Tag::new(ph, 0, c as u32);
        let piece = out.part(chunks, c);
        if v != 0 {
            cx.recv(order[v - lb], tag, piece, false, RailMask::ALL)?;
        }
        let mut k = lb >> 1;
        while k >= 1 {
            if v + k < p {
                cx.send(order[v + k], tag, piece, RailMask::ALL, &[])?;
            }
            k >>= 1;
        }
    }
    Ok(())
}

/// Binomial-tree reduce (relative ranks along the ring, rooted at `root`).
pub(crate) fn tree_reduce(cx: &mut Cx<'_>, ring: &[Rank], root: Rank, n: u64) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let order = rotate(ring, root, 0);
    let p = order.len();
    let v = position(&order, cx.me).unwrap_or(0);
    let out = Elems::new(Buf::Output, 0, n);
    let chunks = u64::from(cx.chunks);
    cx.copy(Elems::new(Buf::Input, 0, n), out);
    let lb = lowbit(v, p);
    for c in 0..chunks {
        let tag = Tag::new(ph, 0, c as u32);
        let piece = out.part(chunks, c);
        let mut k = 1;
        while k < lb {
            if v + k < p {
                cx.recv(order[v + k], tag, piece, true, RailMask::ALL)?;
            }
            k <<= 1;
        }
        if v != 0 {
            cx.send(order[v - lb], tag, piece, RailMask::ALL, &[])?;
        }
    }
    Ok(())
}

/// Recursive-doubling AllReduce of `out` (holding each rank's contribution) along the
/// ring order; for non-powers of two, the first `2 * extra` positions pair up: even ones
/// hand their data to their odd neighbour and get the result back at the end.
pub(crate) fn recursive_doubling(cx: &mut Cx<'_>, ring: &[Rank], out: Elems) -> Result<(), AlgoError> {
    let (ph_in, ph_rd, ph_out) = (cx.phase(), cx.phase(), cx.phase());
    let p = ring.len();
    let Some(pos) = position(ring, cx.me) else { return Ok(()) };
    if p < 2 {
        return Ok(());
    }
    let p2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let extra = p - p2;
    let all = RailMask::ALL;
    let tag0 = |ph| Tag::new(ph, 0, 0);
    if pos < 2 * extra && pos % 2 == 0 {
        cx.send(ring[pos + 1], tag0(ph_in), out, all, &[])?;
        cx.recv(ring[pos + 1], tag0(ph_out), out, false, all)?;
        return Ok(());
    }
    if pos < 2 * extra {
        cx.recv(ring[pos - 1], tag0(ph_in), out, true, all)?;
    }
    let new_id = if pos < 2 * extra { pos / 2 } else { pos - extra };
    let real = |id: usize| if id < extra { 2 * id + 1 } else { id + extra };
    let mut d = 1;
    let mut round = 0;
    while d < p2 {
        let partner = ring[real(new_id ^ d)];
        let tag = Tag::new(ph_rd, round, 0);
        cx.send(partner, tag, out, all, &[])?;
        cx.recv(partner, tag, out, true, all)?;
        d <<= 1;
        round += 1;
    }
    if pos < 2 * extra {
        cx.send(ring[pos - 1], tag0(ph_out), out, all, &[])?;
    }
    Ok(())
}

/// AlltoAll by pairwise exchange: in round k, send to the k-th next rank on the ring
/// and receive from the k-th previous one.
pub(crate) fn all_to_all(cx: &mut Cx<'_>, ring: &[Rank], n: u64) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let p = ring.len();
    let me = u64::from(cx.me.0);
    let Some(pos) = position(ring, cx.me) else { return Ok(()) };
    cx.copy(Elems::new(Buf::Input, me * n, n), Elems::new(Buf::Output, me * n, n));
    let chunks = u64::from(cx.chunks);
    for k in 1..p {
        let to = ring[(pos + k) % p];
        let from = ring[(pos + p - k) % p];
        for c in 0..chunks {
            let tag = Tag::new(ph, k as u32, c as u32);
            let src = Elems::new(Buf::Input, u64::from(to.0) * n, n).part(chunks, c);
            let dst = Elems::new(Buf::Output, u64::from(from.0) * n, n).part(chunks, c);
            cx.send(to, tag, src, RailMask::ALL, &[])?;
            cx.recv(from, tag, dst, false, RailMask::ALL)?;
        }
    }
    Ok(())
}

/// Point-to-point: `src`'s input lands in `dst`'s output.
pub(crate) fn send_recv(cx: &mut Cx<'_>, src: Rank, dst: Rank, n: u64) -> Result<(), AlgoError> {
    let ph = cx.phase();
    let input = Elems::new(Buf::Input, 0, n);
    let out = Elems::new(Buf::Output, 0, n);
    if src == dst {
        if cx.me == src {
            cx.copy(input, out);
        }
        return Ok(());
    }
    let chunks = u64::from(cx.chunks);
    for c in 0..chunks {
        let tag = Tag::new(ph, 0, c as u32);
        if cx.me == src {
            cx.send(dst, tag, input.part(chunks, c), RailMask::ALL, &[])?;
        } else if cx.me == dst {
            cx.recv(src, tag, out.part(chunks, c), false, RailMask::ALL)?;
        }
    }
    Ok(())
}
