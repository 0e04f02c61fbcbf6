//! One communicator's staging lane for one device: the page-locked slots (registered with
//! every NIC), the host-mapped flags the stream and the host hand segments over with, the
//! enqueue side (on the caller's thread) and the worker thread that runs each segment's host
//! collective.
//!
//! Segments are numbered in one sequence per lane; segment `n` uses slots `n % SLOTS`
//! onwards (one, or two for a group). Three cyclic 32-bit counters in one pinned page:
//! - `ready`: written by the stream after a segment's device-to-host copies (`n + slots`);
//!   the worker waits for it, then runs the host work;
//! - `done`: written by the worker after the host work; the stream waits for it before the
//!   host-to-device copies;
//! - `drained`: written by the stream after those copies; a later segment's staging waits for
//!   it before overwriting the slot (the stream's order covers one stream; this covers calls
//!   on different streams).
//!
//! Invariants: the counters only grow (a stream writes a segment's `ready` and `drained` only
//! once the earlier segments' are written, so calls on several streams cannot set one back);
//! the worker writes `done` for every segment it is handed, failed or not (an error releases
//! the whole call), so a stream is never left waiting; numbers are assigned and
//! stream work enqueued under one lock, in the order the worker receives the calls; the slots
//! and the flag page outlive every stream operation that names them (dropping the lane waits,
//! bounded, for `drained` to catch up, and leaks them with a warning otherwise).

use super::segments::{HostWork, Segment};
use super::{reached, Device, DeviceError, Stream};
use crate::call::{Access, Submitter};
use crate::comm::{Bufs, Call, Registered, Req, Work};
use crate::device::api::DeviceReport;
use crate::error::CommError;
use crossbeam_channel::{Receiver, Sender};
use r2ccl_core::DType;
use r2ccl_transport::MemHandle;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Staging slots per lane.
pub(crate) const SLOTS: usize = 4;
/// How long dropping a lane waits for the streams to run past its last segment.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// The flags, alone in one page (pinned and mapped for the device).
#[repr(C, align(4096))]
struct FlagPage {
    ready: AtomicU32,
    done: AtomicU32,
    drained: AtomicU32,
    _rest: [u32; 1021],
}

/// One staging slot's memory.
enum SlotMem {
    /// A region registered with every NIC, pinned for the device: the host collective runs on
    /// it in place, with no copy.
    Registered { handle: MemHandle, _region: Arc<r2ccl_ucx::MemRegion> },
    /// Page-locked memory of its own, where the driver cannot pin the transport's regions: the
    /// host collective copies it into the library's workspace and back, as caller memory.
    Pinned,
}

/// One staging slot.
struct Slot {
    ptr: *mut u8,
    mem: SlotMem,
}

/// What the enqueue side and the worker share.
struct Staging {
    device: Arc<dyn Device>,
    flags: Box<FlagPage>,
    /// Device address of the flag page.
    flags_dev: u64,
    slots: Vec<Slot>,
    slot_len: usize,
    /// Set by `destroy`: the worker fails what is left at once.
    stop: AtomicBool,
}

// SAFETY: the slot pointers are into regions `_region` keeps mapped; the host touches slot bytes
// only through the progress thread's registered calls, handed over by the flags (module doc).
unsafe impl Send for Staging {}
// SAFETY: as `Send`; shared access reads the pointers and the atomics only.
unsafe impl Sync for Staging {}

impl Staging {
    /// Unpin and free every slot and the flag page (no stream work may use them any more).
    fn free(&self, submitter: &Submitter) {
        for slot in &self.slots {
            match slot.mem {
                SlotMem::Registered { handle, .. } => {
                    // SAFETY: pinned when the slot was made; the caller's promise covers the
                    // streams.
                    let _ = unsafe { self.device.unpin(slot.ptr) };
                    let _ = submitter.tx.send(Req::Free(handle));
                }
                // SAFETY: from `alloc_pinned(slot_len)`; the caller's promise covers the streams.
                SlotMem::Pinned => unsafe { self.device.free_pinned(slot.ptr, self.slot_len) },
            }
        }
        submitter.waker.wake();
        let page: *const FlagPage = &*self.flags;
        // SAFETY: as for the slots.
        let _ = unsafe { self.device.unpin(page.cast_mut().cast()) };
    }

    fn slot_ptr(&self, number: u64) -> *mut u8 {
        self.slots[(number % SLOTS as u64) as usize].ptr
    }
}

/// One call handed to the worker.
struct Job {
    dtype: DType,
    /// (first number, segment), in order.
    segs: Vec<(u64, Segment)>,
    /// One past the last number.
    end: u64,
    deadline: Instant,
    reply: Sender<Result<DeviceReport, CommError>>,
}

/// See the module doc.
pub(crate) struct Lane {
    staging: Arc<Staging>,
    memops: bool,
    /// The next segment number, and why the lane is unusable if it is.
    order: Mutex<(u64, Option<DeviceError>)>,
    jobs: Option<Sender<Job>>,
    worker: Option<std::thread::JoinHandle<()>>,
    submitter: Submitter,
}

impl std::fmt::Debug for Lane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane").field("device", &self.staging.device).field("memops", &self.memops).finish()
    }
}

impl Lane {
    /// Set up a lane of `SLOTS` slots of `slot_len` bytes for `device`.
    pub(crate) fn new(device: Arc<dyn Device>, submitter: Submitter, slot_len: usize) -> Result<Self, CommError> {
        let mut flags = Box::new(FlagPage {
            ready: AtomicU32::new(0),
            done: AtomicU32::new(0),
            drained: AtomicU32::new(0),
            _rest: [0; 1021],
        });
        let page: *mut FlagPage = &mut *flags;
        // SAFETY: the page is owned by `flags`, which `Staging` keeps until after `unpin`.
        let flags_dev = unsafe { device.pin(page.cast(), std::mem::size_of::<FlagPage>()) }?;
        let mut staging = Staging {
            device: device.clone(),
            flags,
            flags_dev,
            slots: Vec::new(),
            slot_len,
            stop: AtomicBool::new(false),
        };
        let mut fallback_said = false;
        for _ in 0..SLOTS {
            let slot = alloc(&submitter, slot_len).and_then(|(handle, ptr, region)| {
                let ptr = ptr as *mut u8;
                // SAFETY: `region` maps `slot_len` bytes at `ptr` (the primary mapping, never
                // remapped) and lives in the slot until after `unpin`.
                match unsafe { device.pin(ptr, slot_len) } {
                    Ok(_) => Ok(Slot { ptr, mem: SlotMem::Registered { handle, _region: region } }),
                    Err(e) => {
                        let _ = submitter.tx.send(Req::Free(handle));
                        submitter.waker.wake();
                        if !fallback_said {
                            fallback_said = true;
                            tracing::warn!(
                                target: "r2ccl::device",
                                error = %e,
                                "cannot page-lock the transport's registered memory: staging through page-locked memory of its own, copied into the library's workspace and back"
                            );
                        }
                        let ptr = device.alloc_pinned(slot_len)?;
                        Ok(Slot { ptr, mem: SlotMem::Pinned })
                    }
                }
            });
            match slot {
                Ok(slot) => staging.slots.push(slot),
                Err(e) => {
                    // Undo what was set up: nothing has used it yet.
                    staging.free(&submitter);
                    return Err(e);
                }
            }
        }
        let memops = device.stream_memops();
        if !memops {
            tracing::warn!(
                target: "r2ccl::device",
                ?device,
                "this device's streams cannot wait on host-mapped flags: device calls run in blocking mode (each segment synchronizes the stream; no copy overlaps the network)"
            );
        }
        let staging = Arc::new(staging);
        let (jobs, rx) = crossbeam_channel::unbounded();
        let worker = std::thread::Builder::new()
            .name("r2ccl-staging".into())
            .spawn({
                let (staging, submitter) = (staging.clone(), submitter.clone());
                move || work(&staging, &submitter, &rx)
            })
            .map_err(|e| CommError::Transport(format!("cannot start the staging thread: {e}")))?;
        Ok(Self { staging, memops, order: Mutex::new((0, None)), jobs: Some(jobs), worker: Some(worker), submitter })
    }

    /// The device it stages for.
    pub(crate) fn device_id(&self) -> u64 {
        self.staging.device.id()
    }

    /// Bytes per slot.
    pub(crate) fn slot_len(&self) -> usize {
        self.staging.slot_len
    }

    /// Enqueue `segs` on `stream` (pieces copied in read device buffer `i` at `ins[i]`, pieces
    /// copied out write `outs[i]`) and hand them to the
    /// worker; the reply comes on the returned channel by `deadline`.
    ///
    /// # Safety
    ///
    /// Every piece's device range is valid for the stream's copies until it has run them.
    pub(crate) unsafe fn enqueue(
        &self,
        stream: &dyn Stream,
        dtype: DType,
        segs: Vec<Segment>,
        ins: &[u64],
        outs: &[u64],
        deadline: Instant,
    ) -> Result<Receiver<Result<DeviceReport, CommError>>, CommError> {
        if stream.device_id() != self.device_id() {
            return Err(CommError::Invalid(
                "the stream belongs to another device than this communicator stages for".into(),
            ));
        }
        let (reply, rx) = crossbeam_channel::bounded(1);
        let mut order = self.order.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(e) = &order.1 {
            return Err(CommError::Device(e.clone()));
        }
        let first = order.0;
        let mut numbered = Vec::with_capacity(segs.len());
        let mut next = first;
        for seg in segs {
            let n = next;
            next += seg.slots() as u64;
            numbered.push((n, seg));
        }
        order.0 = next;
        if !self.memops {
            // SAFETY: forwarded from the caller.
            let r = unsafe { self.run_blocking(stream, dtype, &numbered, (ins, outs), deadline) };
            if let Err(CommError::Device(e)) = &r {
                order.1 = Some(e.clone());
            }
            let _ = reply.send(r);
            return Ok(rx);
        }
        // SAFETY: forwarded from the caller.
        if let Err(e) = unsafe { self.enqueue_stream(stream, &numbered, (ins, outs)) } {
            // A stream left half-enqueued: release it and stop using this lane.
            self.release(next);
            self.staging.flags.drained.store(next as u32, Ordering::Release);
            order.1 = Some(e.clone());
            return Err(CommError::Device(e));
        }
        let job = Job { dtype, segs: numbered, end: next, deadline, reply };
        if self.jobs.as_ref().and_then(|j| j.send(job).ok()).is_none() {
            self.release(next);
            return Err(CommError::Aborted("the staging thread is gone".into()));
        }
        Ok(rx)
    }

    /// The stream's side of every segment, pipelined (module doc).
    unsafe fn enqueue_stream(
        &self,
        stream: &dyn Stream,
        numbered: &[(u64, Segment)],
        (ins, outs): (&[u64], &[u64]),
    ) -> Result<(), DeviceError> {
        let s = &*self.staging;
        let f = s.flags_dev;
        let (ready, done, drained) = (f, f + 4, f + 8);
        let mut pending: VecDeque<usize> = VecDeque::new();
        let finish = |j: usize| -> Result<(), DeviceError> {
            let (n, seg) = &numbered[j];
            let end = n + seg.slots() as u64;
            // SAFETY: the flag page and the slots outlive the stream's work (module doc); the
            // device ranges are the caller's promise.
            unsafe {
                stream.wait_flag(done, end as u32)?;
                for pc in &seg.stage_out {
                    let src = s.slot_ptr(n + pc.slot as u64).add(pc.slot_off);
                    stream.copy_to_device(src, outs[pc.buf] + pc.dev_off, pc.len)?;
                }
                // Counters only grow: with calls on several streams, a segment's `drained` is
                // written after every earlier segment's.
                stream.wait_flag(drained, *n as u32)?;
                stream.write_flag(drained, end as u32)
            }
        };
        for (i, (n, seg)) in numbered.iter().enumerate() {
            let end = n + seg.slots() as u64;
            // The slots this segment takes were last used by numbers below `need`.
            let need = end.saturating_sub(SLOTS as u64);
            while let Some(&j) = pending.front() {
                let (jn, js) = &numbered[j];
                if jn + js.slots() as u64 > need {
                    break;
                }
                finish(j)?;
                pending.pop_front();
            }
            // SAFETY: as in `finish`.
            unsafe {
                if need > 0 {
                    stream.wait_flag(drained, need as u32)?;
                }
                for pc in &seg.stage_in {
                    let dst = s.slot_ptr(n + pc.slot as u64).add(pc.slot_off);
                    stream.copy_to_host(ins[pc.buf] + pc.dev_off, dst, pc.len)?;
                }
                // As `drained`: `ready` is written in segment order whatever the streams.
                stream.wait_flag(ready, *n as u32)?;
                stream.write_flag(ready, end as u32)?;
            }
            pending.push_back(i);
        }
        while let Some(j) = pending.pop_front() {
            finish(j)?;
        }
        Ok(())
    }

    /// Blocking mode: every segment on the caller's thread, synchronizing the stream.
    unsafe fn run_blocking(
        &self,
        stream: &dyn Stream,
        dtype: DType,
        numbered: &[(u64, Segment)],
        (ins, outs): (&[u64], &[u64]),
        deadline: Instant,
    ) -> Result<DeviceReport, CommError> {
        let s = &*self.staging;
        let mut report = DeviceReport::default();
        for (n, seg) in numbered {
            // SAFETY: the slots are this lane's; the device ranges are the caller's promise.
            unsafe {
                for pc in &seg.stage_in {
                    let dst = s.slot_ptr(n + pc.slot as u64).add(pc.slot_off);
                    stream.copy_to_host(ins[pc.buf] + pc.dev_off, dst, pc.len)?;
                }
            }
            stream.synchronize()?;
            report.add(host_work(s, &self.submitter, dtype, *n, seg, deadline)?);
            // SAFETY: as above; the next use of this slot comes after a synchronize.
            unsafe {
                for pc in &seg.stage_out {
                    let src = s.slot_ptr(n + pc.slot as u64).add(pc.slot_off);
                    stream.copy_to_device(src, outs[pc.buf] + pc.dev_off, pc.len)?;
                }
            }
        }
        // The slots must not be reused or freed under the last copies.
        stream.synchronize()?;
        Ok(report)
    }

    /// Let the stream past every segment below `end`.
    fn release(&self, end: u64) {
        self.staging.flags.done.store(end as u32, Ordering::Release);
    }

    /// Stop: with `finish`, the calls handed over run to their end (each by its deadline);
    /// without, they fail at once. Then wait (bounded) for the streams to drain.
    pub(crate) fn shutdown(mut self, finish: bool) {
        if !finish {
            self.staging.stop.store(true, Ordering::Release);
        }
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        self.staging.stop.store(true, Ordering::Release);
        self.jobs = None;
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
        let end = self.order.lock().unwrap_or_else(PoisonError::into_inner).0;
        self.release(end);
        let s = &*self.staging;
        let until = Instant::now() + DRAIN_WAIT;
        // Blocking mode writes no flags: its last copies are on the stream, whose owner
        // synchronizes before freeing anything of its own; ours must outlive them too.
        let drained = || !self.memops || reached(s.flags.drained.load(Ordering::Acquire), end as u32);
        while !drained() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
        if !drained() {
            tracing::warn!(
                target: "r2ccl::device",
                "a stream has not run past this communicator's last device call after {} s: its staging memory is leaked rather than freed under it",
                DRAIN_WAIT.as_secs()
            );
            if let Some(s) = Arc::get_mut(&mut self.staging) {
                std::mem::forget(std::mem::take(&mut s.slots));
                std::mem::forget(std::mem::replace(&mut s.flags, Box::new(FlagPage::zeroed())));
            }
            return;
        }
        // The streams have run past every use.
        s.free(&self.submitter);
    }
}

impl FlagPage {
    fn zeroed() -> Self {
        Self { ready: AtomicU32::new(0), done: AtomicU32::new(0), drained: AtomicU32::new(0), _rest: [0; 1021] }
    }
}

/// Register a region for a slot through the progress thread.
pub(crate) fn alloc(submitter: &Submitter, len: usize) -> Result<Registered, CommError> {
    let (reply, rx) = crossbeam_channel::bounded(1);
    submitter
        .tx
        .send(Req::Alloc { len, reply })
        .map_err(|_| CommError::Aborted("the progress thread is gone".into()))?;
    submitter.waker.wake();
    rx.recv_timeout(Duration::from_secs(30))
        .map_err(|_| CommError::Aborted("the progress thread did not answer an allocation".into()))?
}

/// The worker: each call's segments in order, releasing the stream whatever happens.
fn work(s: &Staging, submitter: &Submitter, jobs: &Receiver<Job>) {
    for job in jobs {
        let mut report = DeviceReport::default();
        let mut result = Ok(());
        for (n, seg) in &job.segs {
            let end = n + seg.slots() as u64;
            if let Err(e) = wait_ready(s, end as u32, job.deadline) {
                result = Err(e);
                break;
            }
            match host_work(s, submitter, job.dtype, *n, seg, job.deadline) {
                Ok(r) => report.add(r),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            s.flags.done.store(end as u32, Ordering::Release);
        }
        // Whatever happened, the stream must not wait for this call any longer.
        s.flags.done.store(job.end as u32, Ordering::Release);
        let _ = job.reply.send(result.map(|()| report));
    }
}

/// Wait until the stream has staged up to `target`, by `deadline` (or until stopped).
fn wait_ready(s: &Staging, target: u32, deadline: Instant) -> Result<(), CommError> {
    let started = Instant::now();
    let mut spins = 0u32;
    loop {
        if reached(s.flags.ready.load(Ordering::Acquire), target) {
            return Ok(());
        }
        if s.stop.load(Ordering::Acquire) {
            return Err(CommError::Aborted("the communicator was destroyed with device calls pending".into()));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(CommError::Timeout {
                seq: 0,
                waited_ms: now.duration_since(started).as_millis() as u64,
                waiting: "the stream to reach the device call (its earlier work has not finished)".into(),
            });
        }
        spins += 1;
        if spins < 64 {
            std::hint::spin_loop();
        } else if spins < 256 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// Run one segment's host work in its slot(s) and wait for it.
fn host_work(
    s: &Staging,
    submitter: &Submitter,
    dtype: DType,
    n: u64,
    seg: &Segment,
    deadline: Instant,
) -> Result<crate::report::CollReport, CommError> {
    let slot = |k: u64| &s.slots[((n + k) % SLOTS as u64) as usize];
    // Registered slots run in place with no copy; memory of the lane's own goes through the
    // caller-memory path (`access` keeps it safe should the wait give up first).
    let (work, count, bufs, access) = match (&seg.work, &slot(0).mem, &slot(1).mem) {
        (HostWork::Coll { coll, count, len }, SlotMem::Registered { handle, .. }, _) => {
            (Work::Coll(*coll), *count, Bufs::RegisteredInPlace { buf: *handle, len: *len, mem: None }, None)
        }
        (HostWork::Coll { coll, count, len }, SlotMem::Pinned, _) => {
            (Work::Coll(*coll), *count, Bufs::InPlace { buf: slot(0).ptr, len: *len }, Some(Access::new()))
        }
        (
            HostWork::Group { ops, in_len, out_len },
            SlotMem::Registered { handle: a, .. },
            SlotMem::Registered { handle: b, .. },
        ) => (
            Work::Group(ops.clone()),
            0,
            Bufs::Registered { input: (*a, *in_len), output: (*b, *out_len), mem: None },
            None,
        ),
        (HostWork::Group { ops, in_len, out_len }, _, _) => (
            Work::Group(ops.clone()),
            0,
            Bufs::Borrowed { input: slot(0).ptr, in_len: *in_len, output: slot(1).ptr, out_len: *out_len },
            Some(Access::new()),
        ),
    };
    let timeout = deadline.saturating_duration_since(Instant::now());
    let call = Call { work, dtype, count, bufs, access };
    submitter.submit(call, Some(timeout))?.wait().map(|(_, r)| r)
}
