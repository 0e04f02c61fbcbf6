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
use std::collections::BTreeMap;

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

#[derive(Clone, Debug)]
struct Seg {
    end: u64,
    writer: u32,
    readers: Vec<u32>,
}

/// Interval map of the last writer and the readers since, per buffer: derives the
/// dependency lists of steps from the byte ranges they touch.
#[derive(Debug)]
struct Hazards {
    maps: [BTreeMap<u64, Seg>; 3],
}

impl Hazards {
    fn new() -> Self {
        let whole = || {
            let mut m = BTreeMap::new();
            m.insert(0, Seg { end: u64::MAX, writer: NONE, readers: Vec::new() });
            m
        };
        Self { maps: [whole(), whole(), whole()] }
    }

    fn split_at(map: &mut BTreeMap<u64, Seg>, x: u64) {
        let found = map.range(..=x).next_back().map(|(k, s)| (*k, s.end));
        if let Some((start, end)) = found {
            if start < x && x < end {
                if let Some(seg) = map.get_mut(&start) {
                    let mut tail = seg.clone();
                    seg.end = x;
                    tail.end = end;
                    map.insert(x, tail);
                }
            }
        }
    }

    /// Record an access by `step`; push the steps it must wait for into `deps`.
    fn access(&mut self, r: Region, write: bool, step: u32, deps: &mut Vec<u32>) {
        if r.len == 0 {
            return;
        }
        let map = &mut self.maps[r.buf as usize];
        Self::split_at(map, r.offset);
        Self::split_at(map, r.end());
        for (_, seg) in map.range_mut(r.offset..r.end()) {
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
