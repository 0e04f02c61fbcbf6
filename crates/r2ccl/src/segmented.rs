//! Large blocking collectives on caller memory, run in segments through two registered slots,
//! so the library's memory does not grow with the call (`transport.host_segment_bytes`).
//!
//! A call whose larger buffer exceeds two slots is cut as device calls are
//! (`device::segments::cut_collective`: the same collective on a sub-range of every block, laid
//! out in place in one slot); each segment is a collective of its own, in place on a registered
//! slot (no copy inside the library, failover and replay as for any registered call). The
//! caller's thread copies a segment in while the one before runs, and its result out after,
//! so the copies overlap the network. Every rank cuts a call the same way (the cut depends on
//! the collective, its count, the world and the slot size; a different `host_segment_bytes` on
//! one rank is an argument mismatch, not a hang). Calls that are not blocking (`start`,
//! `start_raw`, scopes) and groups are not cut.
//!
//! On an error the later segments are not started and the call returns it once the segments
//! already started have ended: the output then holds the results of the segments before the
//! failed one (an in-place input may be partly overwritten), as NCCL leaves a failed call's
//! buffers undefined.

use crate::call::Waiter;
use crate::comm::{Bufs, Call, Communicator, Registered, Work};
use crate::device::segments::{cut_collective, Segment};
use crate::error::CommError;
use crate::report::CollReport;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Slots a segmented call cycles through: one runs while the next is copied in.
const SLOTS: usize = 2;

/// The slots, registered on first use and kept for the communicator's life.
pub(crate) struct HostSlots {
    slots: Vec<Registered>,
    len: usize,
}

impl std::fmt::Debug for HostSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostSlots").field("slots", &self.slots.len()).field("len", &self.len).finish()
    }
}

impl HostSlots {
    fn ptr(&self, i: usize) -> *mut u8 {
        self.slots[i % SLOTS].1 as *mut u8
    }

    /// Give the slots back (no call runs on them any more).
    pub(crate) fn free(self, tx: &crossbeam_channel::Sender<crate::comm::Req>) {
        for (handle, ..) in self.slots {
            let _ = tx.send(crate::comm::Req::Free(handle));
        }
    }
}

/// Copy `seg`'s pieces between the caller's buffer at `base` and slot memory at `slot`:
/// into the slot when `inward`.
///
/// # Safety
/// `base` must be valid for every piece's `dev_off..dev_off + len` (reads when `inward`, writes
/// otherwise), `slot` for every piece's `slot_off..slot_off + len`, and nothing else may touch
/// either range meanwhile.
unsafe fn copy_pieces(seg: &Segment, base: *mut u8, slot: *mut u8, inward: bool) {
    let pieces = if inward { &seg.stage_in } else { &seg.stage_out };
    for pc in pieces {
        let off = usize::try_from(pc.dev_off).unwrap_or(usize::MAX);
        // SAFETY: the caller's promise above.
        unsafe {
            let (caller, staged) = (base.add(off), slot.add(pc.slot_off));
            if inward {
                std::ptr::copy_nonoverlapping(caller, staged, pc.len);
            } else {
                std::ptr::copy_nonoverlapping(staged, caller, pc.len);
            }
        }
    }
}

impl Communicator {
    /// Run `call` in segments when it is a blocking collective on caller memory larger than two
    /// slots; `None` when it is not one (the caller runs it whole).
    pub(crate) fn run_in_segments(
        &self,
        call: &Call,
        timeout: Option<Duration>,
    ) -> Option<Result<CollReport, CommError>> {
        let slot_len = usize::try_from(self.template.config.transport.host_segment_bytes).ok()?;
        let Work::Coll(coll) = &call.work else { return None };
        let (send, recv, len) = match call.bufs {
            Bufs::Borrowed { input, in_len, output, out_len } => (input.cast_mut(), output, in_len.max(out_len)),
            Bufs::InPlace { buf, len } => (buf, buf, len),
            _ => return None,
        };
        if slot_len == 0 || self.world < 2 || len <= SLOTS * slot_len {
            return None;
        }
        // Sizes that do not fit go whole, to be refused with the call's own error.
        let (in_len, out_len) =
            r2ccl_algo::ScheduleRequest::new(*coll, call.dtype, call.count).buffer_lens(self.world as usize).ok()?;
        let fits = match call.bufs {
            Bufs::Borrowed { in_len: i, out_len: o, .. } => i as u64 == in_len && o as u64 == out_len,
            Bufs::InPlace { len, .. } => len as u64 == in_len.max(out_len),
            _ => false,
        };
        if !fits {
            return None;
        }
        Some(self.segmented(*coll, call, (send, recv), (in_len as usize, out_len as usize), slot_len, timeout))
    }

    fn segmented(
        &self,
        coll: r2ccl_algo::Collective,
        call: &Call,
        (send, recv): (*mut u8, *mut u8),
        (in_len, out_len): (usize, usize),
        slot_len: usize,
        timeout: Option<Duration>,
    ) -> Result<CollReport, CommError> {
        // In place, AllGather's input and ReduceScatter's output are this rank's block.
        let me = self.rank as usize;
        let (send, recv) = match (std::ptr::eq(send, recv), in_len.cmp(&out_len)) {
            // SAFETY (of the offsets): inside the buffer checked above.
            (true, std::cmp::Ordering::Less) => (unsafe { recv.add(me * in_len) }, recv),
            (true, std::cmp::Ordering::Greater) => (send, unsafe { send.add(me * out_len) }),
            _ => (send, recv),
        };
        let segs = cut_collective(coll, call.dtype, call.count, self.world, self.rank, slot_len)
            .map_err(|e| CommError::Invalid(e.to_string()))?;
        let deadline = Instant::now() + timeout.unwrap_or_else(|| self.collective_timeout());
        // One segmented call at a time: its segments must reach the progress thread together.
        let mut guard = self.host_slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if guard.as_ref().is_none_or(|s| s.len != slot_len) {
            let mut slots = Vec::with_capacity(SLOTS);
            for _ in 0..SLOTS {
                slots.push(crate::device::alloc_registered(&self.submitter(), slot_len)?);
            }
            *guard = Some(HostSlots { slots, len: slot_len });
        }
        let Some(slots) = guard.as_ref() else { return Err(CommError::Invalid("no host slots".into())) };
        let started = Instant::now();
        let mut running: VecDeque<(usize, Waiter)> = VecDeque::new();
        let mut last: Option<CollReport> = None;
        let mut failed: Option<CommError> = None;
        // Wait for the oldest running segment and copy its result out.
        let finish = |running: &mut VecDeque<(usize, Waiter)>, failed: &mut Option<CommError>| {
            let (i, w) = running.pop_front()?;
            match w.wait() {
                Ok((_, report)) if failed.is_none() => {
                    // SAFETY: segment `i` is over, so nothing else uses its slot; the caller's
                    // buffer is borrowed for the whole call.
                    unsafe { copy_pieces(&segs[i], recv, slots.ptr(i), false) };
                    Some(report)
                }
                Ok(_) => None,
                Err(e) => {
                    failed.get_or_insert(e);
                    None
                }
            }
        };
        for (i, seg) in segs.iter().enumerate() {
            if running.len() == SLOTS {
                last = finish(&mut running, &mut failed).or(last);
            }
            if failed.is_some() {
                break;
            }
            let crate::device::segments::HostWork::Coll { coll, count, len } = seg.work else {
                failed = Some(CommError::Invalid("a collective cut into a group".into()));
                break;
            };
            // SAFETY: the slot's segment (i - SLOTS) is over; the caller's buffer is borrowed.
            unsafe { copy_pieces(seg, send, slots.ptr(i), true) };
            let handle = slots.slots[i % SLOTS].0;
            let part = Call {
                work: Work::Coll(coll),
                dtype: call.dtype,
                count,
                bufs: Bufs::RegisteredInPlace { buf: handle, len },
                access: None,
            };
            match self.submit(part, Some(deadline.saturating_duration_since(Instant::now()))) {
                Ok(w) => running.push_back((i, w)),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        while !running.is_empty() {
            last = finish(&mut running, &mut failed).or(last);
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut report = last.ok_or_else(|| CommError::Invalid("a segmented call with no segment".into()))?;
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }
}
