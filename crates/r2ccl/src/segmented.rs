//! Collectives larger than two slots of `transport.host_segment_bytes`, run in segments by the
//! communicator's host lane (on caller memory through two registered slots), so the library's
//! memory does not grow with the call; and the order calls reach the progress thread in.
//!
//! A call is cut as device calls are (`device::segments::cut_collective`: the same collective
//! on a sub-range of every block, laid out in place in one slot); each segment is a collective
//! of its own, in place on a registered slot (no copy inside the library, failover and replay
//! as for any registered call). Blocking and non-blocking calls alike are cut (`run`, the typed
//! calls, `start`, `start_raw` and so the torch backend, scopes); groups are not. Every rank
//! cuts a call the same way (the cut depends on the collective, its count, the world and the
//! slot size; a different `host_segment_bytes` on one rank is an argument mismatch, not a hang).
//!
//! A call on registered buffers ([`crate::CommBuf`]) needs no slot: one of a single block
//! (AllReduce, Broadcast, Reduce) larger than two slots runs as the same segments as caller
//! memory (one slot's bytes each), each in place on a sub-range of the caller's regions, so the
//! engine's workspace (room for private copies of late sends) is sized by a segment and ranks may
//! mix registered and caller memory in one call; a registered ReduceScatter (its blocks are not
//! contiguous in a segment, and whole its scratch is as large as its input) goes through the
//! slots as caller memory does; registered AllGather and AlltoAll run whole (their workspace does
//! not grow with the call, and through the slots they would copy every byte), so one of them
//! larger than two slots, registered on one rank and on caller memory on another, is an argument
//! mismatch error.
//!
//! The host lane is one worker thread per communicator, started by its first cut call: it
//! copies a segment in while the one before runs, copies each result out after, and answers
//! the call once its last segment has ended.
//!
//! Invariants:
//! - Calls reach the progress thread in the order the caller made them. A call that is not cut
//!   goes straight there only while no call handed to the lane still has segments to hand over
//!   (`LaneState::queued`, counted under the lane's lock, which the worker takes to lower it
//!   after a call's last hand-over); otherwise it goes through the lane, behind them.
//! - The worker touches the caller's memory only under the call's [`Access`] (call.rs), so a
//!   caller that stopped waiting is never read or written again.
//! - On an error the later segments are not started, and the call fails once the segments
//!   already started have ended: the output then holds the results of the segments before the
//!   failed one (an in-place input may be partly overwritten), as NCCL leaves a failed call's
//!   buffers undefined.

use crate::call::{Access, Reply, Submitter, Waiter};
use crate::comm::{Bufs, Call, Communicator, Registered, Req, Work};
use crate::device::segments::{cut_collective, HostWork, Segment};
use crate::error::CommError;
use crate::report::CollReport;
use crossbeam_channel::{Receiver, Sender};
use r2ccl_algo::Collective;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Slots a cut call cycles through: one runs while the next is copied in.
const SLOTS: usize = 2;

/// What a communicator and its host lane's worker share.
#[derive(Default)]
pub(crate) struct LaneState {
    jobs: Option<Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Calls handed to the worker whose work has not all reached the progress thread.
    queued: usize,
}

/// A communicator's host lane (started by its first cut call).
pub(crate) type HostLane = Arc<Mutex<LaneState>>;

/// A call cut into segments, and the caller's memory they copy from and to.
struct Cut {
    segs: Vec<Segment>,
    dtype: r2ccl_core::DType,
    send: *const u8,
    recv: *mut u8,
    access: Access,
    /// An owned call's buffers ([`Communicator::start`]): the input kept alive while it is
    /// read, the output answered.
    owned: Option<(Vec<u8>, Vec<u8>)>,
}

/// One call handed to the worker.
enum Job {
    /// A call that runs whole, handed over behind the cut calls before it.
    Whole {
        call: Call,
        deadline: Instant,
        reply: Sender<Reply>,
    },
    Cut {
        cut: Cut,
        deadline: Instant,
        reply: Sender<Reply>,
    },
    /// A registered call's segments, each in place on a sub-range of the caller's regions.
    Parts {
        parts: Vec<Call>,
        deadline: Instant,
        reply: Sender<Reply>,
    },
}

/// How a call is cut.
enum Planned {
    /// Through the slots, copied in and out.
    Copied(Cut),
    /// On the caller's registered regions, segment by segment (no copy).
    InPlace(Vec<Call>),
}

// SAFETY: the caller's pointers in a `Cut` are dereferenced only under its `Access`, which the
// caller's waiter revokes before it returns without the reply (module doc; as `Bufs`).
unsafe impl Send for Job {}

/// Copy `seg`'s pieces between the caller's buffer and slot memory at `slot`: from `src` into
/// the slot when `inward`, else from the slot to `dst`.
///
/// # Safety
/// The caller's buffer must be valid for every piece's `dev_off..dev_off + len` (reads when
/// `inward`, writes otherwise), `slot` for every piece's `slot_off..slot_off + len`, and nothing
/// else may touch either range meanwhile.
unsafe fn copy_pieces(seg: &Segment, (src, dst): (*const u8, *mut u8), slot: *mut u8, inward: bool) {
    let pieces = if inward { &seg.stage_in } else { &seg.stage_out };
    for pc in pieces {
        let off = usize::try_from(pc.dev_off).unwrap_or(usize::MAX);
        // SAFETY: the caller's promise above.
        unsafe {
            let staged = slot.add(pc.slot_off);
            if inward {
                std::ptr::copy_nonoverlapping(src.add(off), staged, pc.len);
            } else {
                std::ptr::copy_nonoverlapping(staged, dst.add(off), pc.len);
            }
        }
    }
}

impl Communicator {
    /// Hand `call` over in order (module doc): to the host lane when it is cut or the lane has
    /// calls still to hand over, else straight to the progress thread.
    pub(crate) fn submit_ordered(&self, call: Call, timeout: Option<Duration>) -> Result<Waiter, CommError> {
        let sub = self.submitter();
        let timeout = timeout.unwrap_or(sub.default_timeout);
        let deadline = Instant::now() + timeout;
        let cut = self.cut_of(call);
        let mut lane = self.host_lane.lock().unwrap_or_else(PoisonError::into_inner);
        let (reply, rx) = crossbeam_channel::bounded(1);
        let (job, access) = match cut {
            Err(call) if lane.queued == 0 => {
                let access = call.access.clone();
                sub.send(call, deadline, reply)?;
                return Ok(sub.waiter(rx, access, deadline, timeout));
            }
            Err(call) => {
                let access = call.access.clone();
                (Job::Whole { call, deadline, reply }, access)
            }
            Ok(Planned::Copied(cut)) => {
                let access = Some(cut.access.clone());
                (Job::Cut { cut, deadline, reply }, access)
            }
            Ok(Planned::InPlace(parts)) => (Job::Parts { parts, deadline, reply }, None),
        };
        if let Some(e) = sub.shared.async_error() {
            return Err(e);
        }
        let jobs = match &lane.jobs {
            Some(jobs) => jobs.clone(),
            None => {
                let (jobs, inbox) = crossbeam_channel::unbounded();
                let (worker, shared) = (sub.clone(), self.host_lane.clone());
                let slot_len = usize::try_from(self.template.config.transport.host_segment_bytes).unwrap_or(0);
                let thread = std::thread::Builder::new()
                    .name(format!("r2ccl-segments-{}", self.rank))
                    .spawn(move || work(&inbox, &worker, &shared, slot_len))
                    .map_err(|e| CommError::Aborted(format!("cannot start the host lane's thread: {e}")))?;
                lane.jobs = Some(jobs.clone());
                lane.thread = Some(thread);
                jobs
            }
        };
        lane.queued += 1;
        if jobs.send(job).is_err() {
            lane.queued -= 1;
            return Err(CommError::Aborted("the host lane is gone".into()));
        }
        Ok(sub.waiter(rx, access, deadline, timeout))
    }

    /// The segments `call` runs in, or the call back when it runs whole: it is not a collective
    /// on caller memory larger than two slots, or its buffers do not have the collective's sizes
    /// (it is refused with its own error then).
    fn cut_of(&self, mut call: Call) -> Result<Planned, Call> {
        let slot_len = usize::try_from(self.template.config.transport.host_segment_bytes).unwrap_or(0);
        let Work::Coll(coll) = call.work else { return Err(call) };
        let Ok((in_len, out_len)) =
            r2ccl_algo::ScheduleRequest::new(coll, call.dtype, call.count).buffer_lens(self.world as usize)
        else {
            return Err(call);
        };
        let (Ok(in_len), Ok(out_len)) = (usize::try_from(in_len), usize::try_from(out_len)) else { return Err(call) };
        // A call of one block or a ReduceScatter is cut the same way whatever its buffers, so
        // ranks may mix registered and caller memory in it: into the segments `cut_collective`
        // makes of its arguments. A registered call of one block runs them in place on its own
        // regions; a registered ReduceScatter (whole, its scratch would be as large as its input,
        // and its segments are not contiguous) runs them through the slots as caller memory does.
        // A registered AllGather or AlltoAll runs whole (its workspace does not grow with the call:
        // no scratch, no send a later step overwrites; through the slots it would copy every
        // byte, 25-37% of its bus bandwidth at 64 MiB), so a rank that runs one larger than two
        // slots on caller memory while another runs it registered gets a mismatch error.
        let one_block = matches!(
            coll,
            Collective::AllReduce { .. }
                | Collective::Broadcast { .. }
                | Collective::Reduce { .. }
                | Collective::SendRecv { .. }
        );
        let is_rs = matches!(coll, Collective::ReduceScatter { .. });
        if one_block && matches!(call.bufs, Bufs::Registered { .. } | Bufs::RegisteredInPlace { .. }) {
            return self.parts_of(call, coll, (in_len, out_len), slot_len).map(Planned::InPlace);
        }
        let (send, recv, fits) = match &mut call.bufs {
            Bufs::Borrowed { input, in_len: i, output, out_len: o } => {
                (input.cast_mut(), *output, *i == in_len && *o == out_len)
            }
            Bufs::InPlace { buf, len } => (*buf, *buf, *len == in_len.max(out_len)),
            Bufs::Owned { input, output } => {
                (input.as_mut_ptr(), output.as_mut_ptr(), input.len() == in_len && output.len() == out_len)
            }
            Bufs::Registered { input, output, mem: Some((i, o)) } if is_rs => {
                (i.cast_mut(), *o, input.1 >= in_len && output.1 >= out_len)
            }
            Bufs::RegisteredInPlace { len, mem: Some(b), .. } if is_rs => (*b, *b, *len >= in_len.max(out_len)),
            _ => return Err(call),
        };
        if slot_len == 0 || self.world < 2 || !fits || in_len.max(out_len) <= SLOTS * slot_len {
            return Err(call);
        }
        let Ok(segs) = cut_collective(coll, call.dtype, call.count, self.world, self.rank, slot_len) else {
            return Err(call);
        };
        // In place, AllGather's input and ReduceScatter's output are this rank's block.
        let me = self.rank as usize;
        let (send, recv) = match (std::ptr::eq(send, recv), in_len.cmp(&out_len)) {
            // SAFETY: the offset is inside the buffer, whose size was checked above.
            (true, std::cmp::Ordering::Less) => (unsafe { recv.add(me * in_len) }, recv),
            // SAFETY: as above.
            (true, std::cmp::Ordering::Greater) => (send, unsafe { send.add(me * out_len) }),
            _ => (send, recv),
        };
        let owned = match std::mem::replace(&mut call.bufs, Bufs::InPlace { buf: std::ptr::null_mut(), len: 0 }) {
            Bufs::Owned { input, output } => Some((input, output)),
            _ => None,
        };
        let access = call.access.clone().unwrap_or_else(Access::new);
        Ok(Planned::Copied(Cut { segs, dtype: call.dtype, send, recv, access, owned }))
    }

    /// A registered call of one block (AllReduce, Broadcast, Reduce, SendRecv) larger than two
    /// slots, cut into segments of one slot's bytes (as `cut_collective` cuts caller memory),
    /// each the same collective in place on a sub-range of the caller's regions: no copy, and
    /// the engine's workspace (room for private copies of late sends) is sized by a segment, not
    /// by the call.
    fn parts_of(
        &self,
        call: Call,
        coll: Collective,
        (in_len, out_len): (usize, usize),
        slot_len: usize,
    ) -> Result<Vec<Call>, Call> {
        let (input, output, fits) = match call.bufs {
            Bufs::Registered { input, output, .. } => (input.0, output.0, input.1 >= in_len && output.1 >= out_len),
            Bufs::RegisteredInPlace { buf, len, .. } => (buf, buf, len >= in_len.max(out_len)),
            _ => return Err(call),
        };
        let elem = call.dtype.size();
        let per = (slot_len / elem) as u64;
        if !fits || self.world < 2 || in_len != out_len || in_len <= SLOTS * slot_len || per == 0 {
            return Err(call);
        }
        let mut parts = Vec::new();
        let mut at = 0u64;
        while at < call.count {
            let count = per.min(call.count - at);
            let off = usize::try_from(at).unwrap_or(usize::MAX).saturating_mul(elem);
            parts.push(Call {
                work: Work::Coll(coll),
                dtype: call.dtype,
                count,
                bufs: Bufs::RegisteredAt { input: (input, off), output: (output, off) },
                access: None,
            });
            at += count;
        }
        Ok(parts)
    }

    /// Stop the host lane: no more calls; with `linger`, wait for the calls it holds (each
    /// bounded by its deadline). The worker, if any, to join once the progress thread is gone.
    pub(crate) fn close_host_lane(&self, linger: bool) -> Option<std::thread::JoinHandle<()>> {
        let (jobs, thread) = {
            let mut lane = self.host_lane.lock().unwrap_or_else(PoisonError::into_inner);
            (lane.jobs.take(), lane.thread.take())
        };
        drop(jobs);
        match thread {
            Some(t) if linger => {
                let _ = t.join();
                None
            }
            t => t,
        }
    }
}

/// The worker: each call in order; cut calls segment by segment.
fn work(jobs: &Receiver<Job>, sub: &Submitter, lane: &Mutex<LaneState>, slot_len: usize) {
    let release = || {
        let mut lane = lane.lock().unwrap_or_else(PoisonError::into_inner);
        lane.queued = lane.queued.saturating_sub(1);
    };
    let mut slots: Vec<Registered> = Vec::new();
    for job in jobs {
        match job {
            Job::Whole { call, deadline, reply } => {
                if let Err(e) = sub.send(call, deadline, reply.clone()) {
                    let _ = reply.send(Err(e));
                }
                release();
            }
            Job::Parts { parts, deadline, reply } => {
                let done = run_parts(sub, parts, deadline, &release);
                let _ = reply.send(done);
            }
            Job::Cut { cut, deadline, reply } => {
                let mut released = false;
                let mut once = || {
                    if !std::mem::replace(&mut released, true) {
                        release();
                    }
                };
                let done = run_cut(sub, &mut slots, slot_len, cut, deadline, &mut once);
                once();
                let _ = reply.send(done);
            }
        }
    }
    for (handle, ..) in slots {
        let _ = sub.tx.send(Req::Free(handle));
    }
    sub.waker.wake();
}

/// Run a registered call's segments: all handed over at once (they need no slot), then
/// `handed_over`, then each waited for.
fn run_parts(sub: &Submitter, parts: Vec<Call>, deadline: Instant, handed_over: &dyn Fn()) -> Reply {
    let started = Instant::now();
    let mut waiters = Vec::with_capacity(parts.len());
    let mut failed = None;
    for part in parts {
        match sub.submit(part, Some(deadline.saturating_duration_since(Instant::now()))) {
            Ok(w) => waiters.push(w),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    handed_over();
    let mut last = None;
    for w in waiters {
        match w.wait() {
            Ok((_, report)) => last = Some(report),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match (failed, last) {
        (Some(e), _) => Err(e),
        (None, Some(mut report)) => {
            report.seconds = started.elapsed().as_secs_f64();
            Ok((Vec::new(), report))
        }
        (None, None) => Err(CommError::Invalid("a call in segments with no segment".into())),
    }
}

/// Run one cut call; `handed_over` is called once its last segment has reached the progress
/// thread (or none will).
fn run_cut(
    sub: &Submitter,
    slots: &mut Vec<Registered>,
    slot_len: usize,
    cut: Cut,
    deadline: Instant,
    handed_over: &mut dyn FnMut(),
) -> Reply {
    let started = Instant::now();
    while slots.len() < SLOTS {
        match crate::device::alloc_registered(sub, slot_len) {
            Ok(slot) => slots.push(slot),
            Err(e) => return Err(e),
        }
    }
    let slot_ptr = |i: usize| slots[i % SLOTS].1 as *mut u8;
    let gone = || CommError::Aborted("the caller stopped waiting for a call in segments".into());
    let mut running: VecDeque<(usize, Waiter)> = VecDeque::new();
    let mut last: Option<CollReport> = None;
    let mut failed: Option<CommError> = None;
    // Wait for the oldest running segment and copy its result out.
    let finish = |running: &mut VecDeque<(usize, Waiter)>, failed: &mut Option<CommError>| {
        let (i, w) = running.pop_front()?;
        match w.wait() {
            Ok((_, report)) if failed.is_none() => {
                // SAFETY: segment `i` is over, so nothing else uses its slot; the caller's
                // memory is valid while its access is (module doc).
                let copied = cut.access.with(|| unsafe {
                    copy_pieces(&cut.segs[i], (cut.send, cut.recv), slot_ptr(i), false);
                });
                if copied.is_none() {
                    failed.get_or_insert_with(gone);
                }
                Some(report)
            }
            Ok(_) => None,
            Err(e) => {
                failed.get_or_insert(e);
                None
            }
        }
    };
    for (i, seg) in cut.segs.iter().enumerate() {
        if running.len() == SLOTS {
            last = finish(&mut running, &mut failed).or(last);
        }
        if failed.is_some() {
            break;
        }
        let HostWork::Coll { coll, count, len } = seg.work else {
            failed = Some(CommError::Invalid("a collective cut into a group".into()));
            break;
        };
        // SAFETY: the slot's segment (i - SLOTS) is over; the caller's memory is valid while
        // its access is.
        let copied = cut.access.with(|| unsafe { copy_pieces(seg, (cut.send, cut.recv), slot_ptr(i), true) });
        if copied.is_none() {
            failed = Some(gone());
            break;
        }
        let part = Call {
            work: Work::Coll(coll),
            dtype: cut.dtype,
            count,
            bufs: Bufs::RegisteredInPlace { buf: slots[i % SLOTS].0, len, mem: None },
            access: None,
        };
        match sub.submit(part, Some(deadline.saturating_duration_since(Instant::now()))) {
            Ok(w) => running.push_back((i, w)),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    handed_over();
    while !running.is_empty() {
        last = finish(&mut running, &mut failed).or(last);
    }
    if let Some(e) = failed {
        return Err(e);
    }
    let mut report = last.ok_or_else(|| CommError::Invalid("a call in segments with no segment".into()))?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok((cut.owned.map(|(_, output)| output).unwrap_or_default(), report))
}
