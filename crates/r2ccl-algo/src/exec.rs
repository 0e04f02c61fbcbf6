//! The reference executor: runs every rank's schedule on in-memory byte buffers in one
//! thread and returns every rank's output buffer. Sends are eager (the message is copied
//! at send time); a receive waits for its message. When no rank can move and steps are
//! left, it reports a deadlock instead of hanging.

use crate::schedule::{Buf, RankSchedule, Region, StepKind};
use crate::ExecError;
use r2ccl_core::kernels::{finalize_avg_bytes, reduce_bytes};
use r2ccl_core::{Rank, ReduceOp};
use std::collections::HashMap;

/// In which order the executor runs each rank's steps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExecOrder {
    /// Program order: a rank runs its steps one after another.
    #[default]
    Program,
    /// Dependency order, adversarially: at every turn a rank runs the *latest* step
    /// whose dependencies are done (and whose message, for a receive, has arrived).
    /// Passing in this order shows the dependency lists are sufficient for pipelining.
    Dataflow,
}

struct RankState {
    bufs: [Vec<u8>; 3],
    done: Vec<bool>,
    pending: Vec<u32>,
    pc: usize,
}

fn slice(bufs: &[Vec<u8>; 3], r: Region) -> &[u8] {
    &bufs[r.buf as usize][r.offset as usize..r.end() as usize]
}

type Key = (u32, u32, u64);

/// Run `schedules` (one per rank, in rank order) on `inputs` and return every rank's
/// output buffer.
///
/// Errors: mismatched inputs, regions outside their buffers, bad peers or
/// dependencies, duplicate or wrongly sized messages, messages never received, a
/// deadlock, or a kernel error.
pub fn execute(schedules: &[RankSchedule], inputs: &[Vec<u8>], order: ExecOrder) -> Result<Vec<Vec<u8>>, ExecError> {
    if schedules.len() != inputs.len() {
        return Err(ExecError::Mismatch(format!("{} schedules but {} inputs", schedules.len(), inputs.len())));
    }
    let p = schedules.len();
    let mut states = Vec::with_capacity(p);
    for (i, (s, input)) in schedules.iter().zip(inputs).enumerate() {
        if s.rank.index() != i {
            return Err(ExecError::Mismatch(format!("schedule {i} belongs to {}", s.rank)));
        }
        if input.len() as u64 != s.input_len {
            return Err(ExecError::InputSize { rank: s.rank, got: input.len(), expected: s.input_len });
        }
        validate(s, p)?;
        states.push(RankState {
            bufs: [input.clone(), vec![0u8; s.output_len as usize], vec![0u8; s.scratch_len as usize]],
            done: vec![false; s.steps().len()],
            pending: (0..s.steps().len() as u32).rev().collect(),
            pc: 0,
        });
    }
    let mut mailbox: HashMap<Key, Vec<u8>> = HashMap::new();
    loop {
        let mut progress = false;
        for (s, st) in schedules.iter().zip(states.iter_mut()) {
            match order {
                ExecOrder::Program => {
                    while st.pc < s.steps().len() {
                        if !try_step(s, st, st.pc, &mut mailbox)? {
                            break;
                        }
                        st.pc += 1;
                        progress = true;
                    }
                }
                ExecOrder::Dataflow => {
                    // `pending` is kept in decreasing step order: try the latest ready step first.
                    let mut i = 0;
                    while i < st.pending.len() {
                        let step = st.pending[i] as usize;
                        let ready = s.deps(step).iter().all(|&d| st.done[d as usize]);
                        if ready && try_step(s, st, step, &mut mailbox)? {
                            st.pending.remove(i);
                            progress = true;
                            i = 0;
                        } else {
                            i += 1;
                        }
                    }
                }
            }
        }
        let unfinished = |st: &RankState| match order {
            ExecOrder::Program => st.pc < st.done.len(),
            ExecOrder::Dataflow => !st.pending.is_empty(),
        };
        if states.iter().all(|st| !unfinished(st)) {
            break;
        }
        if !progress {
            return Err(deadlock(schedules, &states, order));
        }
    }
    if let Some(&(src, dst, tag)) = mailbox.keys().min() {
        return Err(ExecError::Unconsumed { src: Rank(src), dst: Rank(dst), tag });
    }
    let mut outputs = Vec::with_capacity(p);
    for (s, st) in schedules.iter().zip(states) {
        let [_, mut out, _] = st.bufs;
        if let (Some((r, n)), ReduceOp::Avg) = (s.finalize, s.op) {
            if r.buf == Buf::Output {
                finalize_avg_bytes(s.dtype, &mut out[r.offset as usize..r.end() as usize], n)?;
            }
        }
        outputs.push(out);
    }
    Ok(outputs)
}

fn deadlock(schedules: &[RankSchedule], states: &[RankState], order: ExecOrder) -> ExecError {
    let blocked: Vec<usize> = (0..states.len())
        .filter(|&i| match order {
            ExecOrder::Program => states[i].pc < states[i].done.len(),
            ExecOrder::Dataflow => !states[i].pending.is_empty(),
        })
        .collect();
    let first = blocked.first().copied().unwrap_or(0);
    let st = &states[first];
    let s = &schedules[first];
    let step = match order {
        ExecOrder::Program => st.pc,
        ExecOrder::Dataflow => st.pending.last().map_or(0, |&x| x as usize),
    };
    let (peer, tag) = match s.steps().get(step).map(|x| x.kind) {
        Some(StepKind::Recv { peer, tag, .. }) => (peer, tag.0),
        _ => (s.rank, 0),
    };
    ExecError::Deadlock { blocked: blocked.len(), rank: s.rank, step, peer, tag }
}

fn validate(s: &RankSchedule, p: usize) -> Result<(), ExecError> {
    let check = |step: usize, r: Region| -> Result<(), ExecError> {
        let buf_len = s.buf_len(r.buf);
        if r.end() > buf_len || r.end() < r.offset {
            return Err(ExecError::RegionOutOfBounds { rank: s.rank, step, offset: r.offset, len: r.len, buf_len });
        }
        Ok(())
    };
    let bad = |step: usize, detail: String| ExecError::BadStep { rank: s.rank, step, detail };
    for (i, st) in s.steps().iter().enumerate() {
        if let Some(&d) = s.deps(i).iter().find(|&&d| d as usize >= i) {
            return Err(bad(i, format!("depends on step {d}, which is not earlier")));
        }
        match st.kind {
            StepKind::Send { peer, src, .. } => {
                if peer.index() >= p {
                    return Err(bad(i, format!("peer {peer} is outside the communicator")));
                }
                check(i, src)?;
            }
            StepKind::Recv { peer, dst, .. } => {
                if peer.index() >= p {
                    return Err(bad(i, format!("peer {peer} is outside the communicator")));
                }
                check(i, dst)?;
            }
            StepKind::Copy { src, dst } | StepKind::Reduce { src, dst } => {
                check(i, src)?;
                check(i, dst)?;
                if src.len != dst.len {
                    return Err(bad(i, format!("source has {} bytes, destination {}", src.len, dst.len)));
                }
                if src.buf == dst.buf && src.offset < dst.end() && dst.offset < src.end() {
                    return Err(bad(i, "source and destination overlap".into()));
                }
            }
        }
    }
    Ok(())
}

/// Try to run step `i`; `Ok(false)` when it waits for a message.
fn try_step(
    s: &RankSchedule,
    st: &mut RankState,
    i: usize,
    mailbox: &mut HashMap<Key, Vec<u8>>,
) -> Result<bool, ExecError> {
    let me = s.rank.0;
    match s.steps()[i].kind {
        StepKind::Send { peer, tag, src, .. } => {
            let key = (me, peer.0, tag.0);
            if mailbox.contains_key(&key) {
                return Err(ExecError::DuplicateMessage { src: s.rank, dst: peer, tag: tag.0 });
            }
            mailbox.insert(key, slice(&st.bufs, src).to_vec());
        }
        StepKind::Recv { peer, tag, dst, reduce, .. } => {
            let key = (peer.0, me, tag.0);
            let Some(msg) = mailbox.remove(&key) else { return Ok(false) };
            if msg.len() as u64 != dst.len {
                return Err(ExecError::MessageSize {
                    src: peer,
                    dst: s.rank,
                    step: i,
                    tag: tag.0,
                    got: msg.len(),
                    expected: dst.len,
                });
            }
            let d = &mut st.bufs[dst.buf as usize][dst.offset as usize..dst.end() as usize];
            if reduce {
                reduce_bytes(s.dtype, s.op, d, &msg)?;
            } else {
                d.copy_from_slice(&msg);
            }
        }
        StepKind::Copy { src, dst } | StepKind::Reduce { src, dst } => {
            let data = slice(&st.bufs, src).to_vec();
            let d = &mut st.bufs[dst.buf as usize][dst.offset as usize..dst.end() as usize];
            if matches!(s.steps()[i].kind, StepKind::Copy { .. }) {
                d.copy_from_slice(&data);
            } else {
                reduce_bytes(s.dtype, s.op, d, &data)?;
            }
        }
    }
    st.done[i] = true;
    Ok(true)
}
