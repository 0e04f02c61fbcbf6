//! The schedule representation: one rank's ordered steps over byte regions of its
//! buffers, with dependencies for chunk-level pipelining and per-NIC splits.
//!
//! Semantics (shared by the reference executor, the simulator and real executors):
//! - A rank owns three buffers: `Input` (read-only), `Output`, `Scratch`.
//! - `Send` copies a region into a message `(src, dst, tag)`; `Recv` takes the message
//!   with the same key and either copies it into a region or reduces it into the region
//!   (`region = region op message`). Tags are unique per (sender, receiver) pair within
//!   one schedule, so matching never depends on arrival order.
//! - Steps are listed in a valid program order; running them one after another is always
//!   correct. [`RankSchedule::deps`] lists, for each step, the earlier steps of the same
//!   rank it must wait for (every read-after-write, write-after-read and write-after-write
//!   hazard on overlapping bytes, plus stage barriers). A pipelining executor may start a
//!   step as soon as its dependencies have completed; a send completes when its bytes
//!   have left the source region.
//! - After the last step, if [`RankSchedule::finalize`] is set (reduce op `Avg`), the
//!   region is divided by the given rank count.

use crate::layout::RailSplit;
use r2ccl_core::{DType, Rank, ReduceOp};

/// A rank's buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    /// The user's send buffer (read-only).
    Input = 0,
    /// The user's receive buffer.
    Output = 1,
    /// Library-owned temporary space ([`RankSchedule::scratch_len`] bytes).
    Scratch = 2,
}

/// A byte range of one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First byte.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

impl Region {
    /// A region of `buf`.
    pub const fn new(buf: Buf, offset: u64, len: u64) -> Self {
        Self { buf, offset, len }
    }

    /// One past the last byte.
    pub const fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A message tag: unique per (sender, receiver) pair within one schedule. Builders make
/// it from (phase, step, chunk), the chunk identity of MECHANISMS.md section 1 minus the
/// collective sequence number, which the executor adds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag(pub u64);

impl Tag {
    /// Tag of `chunk` of `step` of `phase` (16, 24 and 24 bits).
    pub const fn new(phase: u16, step: u32, chunk: u32) -> Self {
        Tag(((phase as u64) << 48) | (((step & 0xff_ffff) as u64) << 24) | (chunk & 0xff_ffff) as u64)
    }

    /// The phase part.
    pub const fn phase(self) -> u16 {
        (self.0 >> 48) as u16
    }
}

/// Index into [`RankSchedule::splits`], or [`SplitRef::INTRA`] for a transfer inside a
/// node (NVLink/PCIe/shared memory, no NIC).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SplitRef(pub u16);

impl SplitRef {
    /// Intra-node transfer: uses no NIC.
    pub const INTRA: SplitRef = SplitRef(u16::MAX);

    /// Whether the transfer stays inside the node.
    pub const fn is_intra(self) -> bool {
        self.0 == u16::MAX
    }
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Send `src` to `peer` as message `tag`, split over NICs by `split`.
    Send {
        /// Receiver.
        peer: Rank,
        /// Message tag.
        tag: Tag,
        /// Bytes to send.
        src: Region,
        /// NIC split (sender side view), or intra-node.
        split: SplitRef,
    },
    /// Receive message `tag` from `peer` into `dst`, copying or reducing.
    Recv {
        /// Sender.
        peer: Rank,
        /// Message tag.
        tag: Tag,
        /// Destination bytes (the message has exactly this length).
        dst: Region,
        /// `dst = dst op message` when true, `dst = message` when false.
        reduce: bool,
        /// NIC split (as the sender splits it), or intra-node.
        split: SplitRef,
    },
    /// `dst = src` locally.
    Copy {
        /// Source bytes.
        src: Region,
        /// Destination bytes (same length).
        dst: Region,
    },
    /// `dst = dst op src` locally.
    Reduce {
        /// Source bytes.
        src: Region,
        /// Destination bytes (same length).
        dst: Region,
    },
}

/// One step: its kind and its dependency list (see [`RankSchedule::deps`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// What the step does.
    pub kind: StepKind,
    deps_start: u32,
    deps_len: u32,
}

/// One rank's schedule for one collective. Its size grows with the number of steps this
/// rank runs (plus a handful of NIC split tables), never with the square of the rank count.
#[derive(Clone, Debug, PartialEq)]
pub struct RankSchedule {
    /// The rank that runs it.
    pub rank: Rank,
    /// Communicator size.
    pub ranks: u32,
    /// Element type.
    pub dtype: DType,
    /// Reduce op (`Sum` for collectives that do not reduce).
    pub op: ReduceOp,
    /// Bytes of the input buffer.
    pub input_len: u64,
    /// Bytes of the output buffer.
    pub output_len: u64,
    /// Bytes of scratch space needed.
    pub scratch_len: u64,
    /// Region to divide by the rank count after the last step (op `Avg`).
    pub finalize: Option<(Region, u32)>,
    steps: Vec<Step>,
    deps: Vec<u32>,
    splits: Vec<RailSplit>,
}

impl RankSchedule {
    /// The steps in program order.
    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    /// Indices of the earlier steps that step `i` waits for (empty for an unknown index).
    pub fn deps(&self, i: usize) -> &[u32] {
        self.steps
            .get(i)
            .and_then(|s| self.deps.get(s.deps_start as usize..(s.deps_start + s.deps_len) as usize))
            .unwrap_or(&[])
    }

    /// The NIC split tables referenced by steps.
    pub fn splits(&self) -> &[RailSplit] {
        &self.splits
    }

    /// The split a step's [`SplitRef`] points to (`None` for intra-node).
    pub fn split(&self, r: SplitRef) -> Option<&RailSplit> {
        if r.is_intra() {
            None
        } else {
            self.splits.get(usize::from(r.0))
        }
    }

    /// Length of a buffer of this schedule.
    pub fn buf_len(&self, buf: Buf) -> u64 {
        match buf {
            Buf::Input => self.input_len,
            Buf::Output => self.output_len,
            Buf::Scratch => self.scratch_len,
        }
    }

    /// Approximate heap + inline bytes held by this schedule.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + self.steps.capacity() * std::mem::size_of::<Step>()
            + self.deps.capacity() * 4
            + self
                .splits
                .iter()
                .map(|s| std::mem::size_of::<RailSplit>() + s.parts.capacity() * std::mem::size_of::<crate::RailPart>())
                .sum::<usize>()
    }

    /// Total bytes this rank sends, and how many of them leave the node.
    pub fn sent_bytes(&self) -> (u64, u64) {
        let mut all = 0;
        let mut inter = 0;
        for s in &self.steps {
            if let StepKind::Send { src, split, .. } = s.kind {
                all += src.len;
                if !split.is_intra() {
                    inter += src.len;
                }
            }
        }
        (all, inter)
    }
}

const NONE: u32 = u32::MAX;

/// One segment of a buffer: bytes `[start, end)`, their last writer (`NONE`: none yet) and the steps that read
/// them since.
#[derive(Clone, Debug)]
struct Seg {
    start: u64,
    end: u64,
    writer: u32,
    readers: Vec<u32>,
}

/// Most segments in one block of a [`SegMap`] before it is split in two.
const BLOCK: usize = 64;

/// The segments of one buffer in offset order, partitioning `[0, u64::MAX)`: a two-level sorted list (blocks of
/// at most [`BLOCK`] segments, and the first offset of each block), so that splitting a segment moves at most a
/// block's worth of entries and finding one takes two binary searches.
#[derive(Debug)]
struct SegMap {
    /// First offset of each block (`keys[0] == 0`).
    keys: Vec<u64>,
    /// The blocks, never empty.
    blocks: Vec<Vec<Seg>>,
    /// Block and index of the segment found last: accesses tend to follow each other through a buffer, so
    /// that segment or the next one is tried before searching.
    hint: (usize, usize),
}

impl SegMap {
    fn new() -> Self {
        let whole = Seg { start: 0, end: u64::MAX, writer: NONE, readers: Vec::new() };
        Self { keys: vec![0], blocks: vec![vec![whole]], hint: (0, 0) }
    }

    /// Block and index of the segment that holds byte `x`, or that ends at `x == u64::MAX`.
    fn locate(&mut self, x: u64) -> (usize, usize) {
        let holds = |s: &Seg| s.start <= x && (x < s.end || s.end == u64::MAX);
        let (hb, hi) = self.hint;
        if let Some(blk) = self.blocks.get(hb) {
            if blk.get(hi).is_some_and(holds) {
                return (hb, hi);
            }
            let next = if hi + 1 < blk.len() { (hb, hi + 1) } else { (hb + 1, 0) };
            if self.blocks.get(next.0).and_then(|b| b.get(next.1)).is_some_and(holds) {
                self.hint = next;
                return next;
            }
        }
        let b = self.keys.partition_point(|&k| k <= x).saturating_sub(1);
        let i = self.blocks[b].partition_point(|s| s.start <= x).saturating_sub(1);
        self.hint = (b, i);
        (b, i)
    }

    /// The position after segment `(b, i)`.
    fn next(&self, b: usize, i: usize) -> (usize, usize) {
        if i + 1 < self.blocks[b].len() {
            (b, i + 1)
        } else {
            (b + 1, 0)
        }
    }

    /// Cut segment `(b, i)`, which holds `x` past its start, at `x`; returns the position of its lower part (the
    /// upper part follows it).
    fn cut(&mut self, b: usize, i: usize, x: u64) -> (usize, usize) {
        let block = &mut self.blocks[b];
        let mut tail = block[i].clone();
        block[i].end = x;
        tail.start = x;
        block.insert(i + 1, tail);
        if block.len() <= BLOCK {
            return (b, i);
        }
        let upper = block.split_off(BLOCK / 2);
        self.keys.insert(b + 1, upper[0].start);
        self.blocks.insert(b + 1, upper);
        if i < BLOCK / 2 {
            (b, i)
        } else {
            (b + 1, i - BLOCK / 2)
        }
    }

    /// Make `x` a segment boundary; returns the position of the segment starting at `x` (of the last one when
    /// `x == u64::MAX`).
    fn split_at(&mut self, x: u64) -> (usize, usize) {
        let (b, i) = self.locate(x);
        let seg = &self.blocks[b][i];
        if seg.start >= x || x >= seg.end {
            return (b, i);
        }
        let (b, i) = self.cut(b, i, x);
        self.next(b, i)
    }
}

/// The last writer and the readers since, per byte of each buffer (segments that split as accesses cut them):
/// derives the dependency lists of steps from the byte ranges they touch.
#[derive(Debug)]
struct Hazards {
    maps: [SegMap; 3],
}

impl Hazards {
    fn new() -> Self {
        Self { maps: [SegMap::new(), SegMap::new(), SegMap::new()] }
    }

    /// Record an access by `step`; push the steps it must wait for into `deps`.
    fn access(&mut self, r: Region, write: bool, step: u32, deps: &mut Vec<u32>) {
        if r.len == 0 {
            return;
        }
        let map = &mut self.maps[r.buf as usize];
        let end = r.end();
        let (mut b, mut i) = map.split_at(r.offset);
        while let Some(seg) = map.blocks.get(b).and_then(|blk| blk.get(i)) {
            if seg.start >= end {
                break;
            }
            if seg.end > end {
                (b, i) = map.cut(b, i, end);
            }
            let seg = &mut map.blocks[b][i];
            if seg.writer != NONE {
                deps.push(seg.writer);
            }
            if write {
                deps.extend_from_slice(&seg.readers);
                seg.readers.clear();
                seg.writer = step;
            } else if seg.readers.last() != Some(&step) {
                seg.readers.push(step);
            }
            map.hint = (b, i);
            if seg.end >= end {
                break;
            }
            (b, i) = map.next(b, i);
        }
    }
}

/// Builds one rank's schedule, deriving dependencies from the regions steps touch.
#[derive(Debug)]
pub(crate) struct ScheduleBuilder {
    sched: RankSchedule,
    hazards: Hazards,
    scratch: Vec<u32>,
}

impl ScheduleBuilder {
    pub(crate) fn new(rank: Rank, ranks: u32, dtype: DType, op: ReduceOp, input_len: u64, output_len: u64) -> Self {
        Self {
            sched: RankSchedule {
                rank,
                ranks,
                dtype,
                op,
                input_len,
                output_len,
                scratch_len: 0,
                finalize: None,
                steps: Vec::new(),
                deps: Vec::new(),
                splits: Vec::new(),
            },
            hazards: Hazards::new(),
            scratch: Vec::new(),
        }
    }

    pub(crate) fn reserve(&mut self, steps: usize) {
        self.sched.steps.reserve(steps);
        self.sched.deps.reserve(steps * 2);
    }

    pub(crate) fn set_scratch(&mut self, len: u64) {
        self.sched.scratch_len = self.sched.scratch_len.max(len);
    }

    pub(crate) fn set_finalize(&mut self, region: Region, divisor: u32) {
        self.sched.finalize = Some((region, divisor));
    }

    pub(crate) fn intern_split(&mut self, split: RailSplit) -> SplitRef {
        if let Some(i) = self.sched.splits.iter().position(|s| *s == split) {
            return SplitRef(i as u16);
        }
        self.sched.splits.push(split);
        SplitRef((self.sched.splits.len() - 1) as u16)
    }

    /// Index the next step will get.
    pub(crate) fn next_index(&self) -> u32 {
        self.sched.steps.len() as u32
    }

    /// Push a step; `extra` are additional (barrier) dependencies. Returns its index.
    pub(crate) fn push(&mut self, kind: StepKind, extra: &[u32]) -> u32 {
        let idx = self.next_index();
        let mut deps = std::mem::take(&mut self.scratch);
        deps.clear();
        deps.extend_from_slice(extra);
        match kind {
            StepKind::Send { src, .. } => self.hazards.access(src, false, idx, &mut deps),
            StepKind::Recv { dst, .. } => self.hazards.access(dst, true, idx, &mut deps),
            StepKind::Copy { src, dst } => {
                self.hazards.access(src, false, idx, &mut deps);
                self.hazards.access(dst, true, idx, &mut deps);
            }
            StepKind::Reduce { src, dst } => {
                self.hazards.access(src, false, idx, &mut deps);
                self.hazards.access(dst, true, idx, &mut deps);
            }
        }
        deps.sort_unstable();
        deps.dedup();
        deps.retain(|&d| d < idx);
        let start = self.sched.deps.len() as u32;
        self.sched.deps.extend_from_slice(&deps);
        self.sched.steps.push(Step { kind, deps_start: start, deps_len: deps.len() as u32 });
        self.scratch = deps;
        idx
    }

    /// The schedule built so far.
    pub(crate) fn peek(&self) -> &RankSchedule {
        &self.sched
    }

    pub(crate) fn finish(mut self) -> RankSchedule {
        self.sched.steps.shrink_to_fit();
        self.sched.deps.shrink_to_fit();
        self.sched
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A reference segment: end, last writer, readers since.
    type RefSeg = (u64, u32, Vec<u32>);

    /// The hazard tracking as it was first written (one `BTreeMap` interval map per buffer), kept as the
    /// reference that [`Hazards`] must agree with.
    struct Reference {
        maps: [BTreeMap<u64, RefSeg>; 3],
    }

    impl Reference {
        fn new() -> Self {
            let whole = || BTreeMap::from([(0, (u64::MAX, NONE, Vec::new()))]);
            Self { maps: [whole(), whole(), whole()] }
        }

        fn split_at(map: &mut BTreeMap<u64, RefSeg>, x: u64) {
            let found = map.range(..=x).next_back().map(|(k, s)| (*k, s.0));
            if let Some((start, end)) = found {
                if start < x && x < end {
                    if let Some(seg) = map.get_mut(&start) {
                        let mut tail = seg.clone();
                        seg.0 = x;
                        tail.0 = end;
                        map.insert(x, tail);
                    }
                }
            }
        }

        fn access(&mut self, r: Region, write: bool, step: u32, deps: &mut Vec<u32>) {
            if r.len == 0 {
                return;
            }
            let map = &mut self.maps[r.buf as usize];
            Self::split_at(map, r.offset);
            Self::split_at(map, r.end());
            for (_, (_, writer, readers)) in map.range_mut(r.offset..r.end()) {
                if *writer != NONE {
                    deps.push(*writer);
                }
                if write {
                    deps.extend_from_slice(readers);
                    readers.clear();
                    *writer = step;
                } else if readers.last() != Some(&step) {
                    readers.push(step);
                }
            }
        }
    }

    fn buf(i: u8) -> Buf {
        match i % 3 {
            0 => Buf::Input,
            1 => Buf::Output,
            _ => Buf::Scratch,
        }
    }

    /// Run `accesses` (buffer, offset, length, write; consecutive entries with the same step number belong to one
    /// step) through both trackers; the sorted, deduplicated dependency sets must agree step by step.
    fn agree(accesses: &[(u8, u64, u64, bool, bool)]) {
        let (mut new, mut old) = (Hazards::new(), Reference::new());
        let mut step = 0u32;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for &(bf, offset, len, write, next_step) in accesses {
            if next_step {
                step += 1;
            }
            let r = Region::new(buf(bf), offset, len);
            a.clear();
            b.clear();
            new.access(r, write, step, &mut a);
            old.access(r, write, step, &mut b);
            for v in [&mut a, &mut b] {
                v.sort_unstable();
                v.dedup();
            }
            assert_eq!(a, b, "step {step} accessing {r:?} (write {write})");
        }
        // The segments too: same boundaries, writers and readers.
        for (m, r) in new.maps.iter().zip(&old.maps) {
            let segs: Vec<_> =
                m.blocks.iter().flatten().map(|s| (s.start, s.end, s.writer, s.readers.clone())).collect();
            let want: Vec<_> = r.iter().map(|(&k, (e, w, rd))| (k, *e, *w, rd.clone())).collect();
            assert_eq!(segs, want);
            for (k, blk) in m.keys.iter().zip(&m.blocks) {
                assert!(!blk.is_empty() && blk.len() <= BLOCK && blk[0].start == *k);
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn hazards_match_the_interval_map_reference(
            accesses in proptest::collection::vec((0u8..3, 0u64..600, 0u64..40, any::<bool>(), any::<bool>()), 1..700),
        ) {
            agree(&accesses);
        }
    }

    #[test]
    fn hazards_match_the_reference_on_many_small_segments_and_the_buffer_end() {
        // Enough boundaries for several block splits, walked forwards, backwards and across whole ranges.
        let mut acc = Vec::new();
        for i in 0..300u64 {
            acc.push((1, i * 3, 2, i % 2 == 0, true));
        }
        for i in (0..300u64).rev() {
            acc.push((1, i * 3 + 1, 4, i % 3 == 0, i % 2 == 0));
        }
        acc.push((1, 0, 2000, false, true));
        acc.push((1, 5, 1500, true, true));
        acc.push((2, u64::MAX - 10, 10, true, true));
        acc.push((2, u64::MAX - 20, 15, false, true));
        acc.push((2, 0, u64::MAX, true, true));
        agree(&acc);
    }
}
