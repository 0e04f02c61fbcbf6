//! The device entry points on [`Communicator`] (raw device addresses plus a [`Stream`]), and
//! what they return: [`DeviceHandle`], [`DeviceReport`].

use super::lane::{Lane, SLOTS};
use super::segments::{cut_collective, cut_group};
use super::{Device, Stream};
use crate::comm::Communicator;
use crate::error::CommError;
use crate::report::{CollReport, Schedule};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use r2ccl_algo::{Collective, P2pOp};
use r2ccl_core::{DType, Rank};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

/// How long past a device call's deadline its handle waits for the staging worker, which
/// answers by then itself (the host calls under it have their own margin and abort grace).
const REPLY_MARGIN: Duration = Duration::from_secs(10);

/// One operation of [`Communicator::start_device_group`] (`ncclSend`/`ncclRecv` on device
/// memory between `ncclGroupStart` and `ncclGroupEnd`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeviceP2p {
    /// Send `count` elements at device address `addr` to `peer`.
    Send {
        /// The receiver.
        peer: Rank,
        /// Device address.
        addr: u64,
        /// Elements.
        count: u64,
    },
    /// Receive `count` elements from `peer` into device address `addr`.
    Recv {
        /// The sender.
        peer: Rank,
        /// Device address.
        addr: u64,
        /// Elements.
        count: u64,
    },
}

/// What a finished device call reports: its segments' host collectives.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct DeviceReport {
    /// Host collectives it ran (one per segment).
    pub segments: usize,
    /// The sequence number of the last of them (0 when there were none).
    pub seq: u64,
    /// How the last was scheduled.
    pub strategy: Option<Schedule>,
    /// Wall time of all of them inside the progress thread.
    pub seconds: f64,
}

impl DeviceReport {
    pub(crate) fn add(&mut self, r: CollReport) {
        self.segments += 1;
        self.seq = r.seq;
        self.strategy = Some(r.strategy);
        self.seconds += r.seconds;
    }
}

/// A device call enqueued on its stream. Its network part has finished when [`DeviceHandle::wait`]
/// returns; the device buffers hold the result once the stream has run past the call (later work
/// on the stream sees it; the host sees it after a stream sync). Dropping the handle does not
/// cancel the call.
#[derive(Debug)]
pub struct DeviceHandle {
    rx: Receiver<Result<DeviceReport, CommError>>,
    give_up_at: Instant,
    done: Option<Result<DeviceReport, CommError>>,
}

impl DeviceHandle {
    /// Wait for the network part, by the call's deadline (plus a margin should the staging
    /// worker not answer).
    pub fn wait(self) -> Result<DeviceReport, CommError> {
        if let Some(r) = self.done {
            return r;
        }
        let r = match self.rx.recv_deadline(self.give_up_at) {
            Ok(r) => r,
            Err(RecvTimeoutError::Disconnected) => Err(CommError::Aborted("the staging thread stopped".into())),
            Err(RecvTimeoutError::Timeout) => {
                Err(CommError::Aborted("the staging thread did not answer by the call's deadline".into()))
            }
        };
        if let Err(e) = &r {
            crate::metrics::count_error(e.kind());
        }
        r
    }

    /// Whether the network part has finished, without waiting.
    pub fn is_done(&mut self) -> bool {
        if self.done.is_none() {
            self.done = self.rx.try_recv().ok();
        }
        self.done.is_some()
    }
}

impl Communicator {
    /// Enqueue a collective of `count` elements of `dtype` on device memory, ordered on
    /// `stream` (NCCL's `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`
    /// and its siblings): `send` and `recv` are device addresses holding the sizes
    /// [`Collective`]'s table gives; `send == recv` runs it in place (NCCL's convention). It
    /// returns once the work is enqueued; see [`DeviceHandle`] for when the result is there.
    /// The network part must finish within `timeout` of now (the communicator's
    /// [`Communicator::collective_timeout`] when `None`); if it fails, the stream still runs
    /// past the call (the receive buffer's contents are then unspecified) and the handle says
    /// why.
    ///
    /// # Safety
    ///
    /// `send` and `recv` are device memory of `device` valid for those sizes until `stream`
    /// has run past this call, and nothing else writes them in between.
    #[allow(clippy::too_many_arguments, reason = "NCCL's argument list, plus the device")]
    pub unsafe fn start_device<D: Device>(
        &self,
        device: &Arc<D>,
        stream: &dyn Stream,
        coll: Collective,
        dtype: DType,
        count: u64,
        send: u64,
        recv: u64,
        timeout: Option<Duration>,
    ) -> Result<DeviceHandle, CommError> {
        let (in_len, out_len) = r2ccl_algo::ScheduleRequest::new(coll, dtype, count)
            .buffer_lens(self.world as usize)
            .map_err(|e| CommError::Invalid(e.to_string()))?;
        let me = u64::from(self.rank);
        // In place, AllGather's input and ReduceScatter's output are this rank's block.
        let (send, recv) = match (send == recv, in_len.cmp(&out_len)) {
            (true, std::cmp::Ordering::Less) => (recv + me * in_len, recv),
            (true, std::cmp::Ordering::Greater) => (send, send + me * out_len),
            _ => (send, recv),
        };
        let deadline = self.deadline(timeout);
        self.with_lane(device, deadline, |lane| {
            let segs = cut_collective(coll, dtype, count, self.world, self.rank, lane.slot_len())
                .map_err(|e| CommError::Invalid(e.to_string()))?;
            // SAFETY: the caller's promise covers every piece (each inside its buffer's sizes).
            unsafe { lane.enqueue(stream, dtype, segs, &[send], &[recv], deadline) }
        })
    }

    /// Enqueue a group of point-to-point operations on device memory, ordered on `stream`
    /// (the device form of [`Communicator::group_bytes`], whose matching rules apply). All
    /// sends together, and all receives together, must fit one staging slot (a quarter of
    /// `transport.device_staging_bytes`).
    ///
    /// # Safety
    ///
    /// As [`Communicator::start_device`], for every operation's `count` elements at `addr`.
    pub unsafe fn start_device_group<D: Device>(
        &self,
        device: &Arc<D>,
        stream: &dyn Stream,
        dtype: DType,
        ops: &[DeviceP2p],
        timeout: Option<Duration>,
    ) -> Result<DeviceHandle, CommError> {
        let mut plan = Vec::with_capacity(ops.len());
        let mut addrs = Vec::with_capacity(ops.len());
        for (i, op) in ops.iter().enumerate() {
            let (peer, addr, p2p) = match *op {
                DeviceP2p::Send { peer, addr, count } => (peer, addr, P2pOp::Send { peer, count }),
                DeviceP2p::Recv { peer, addr, count } => (peer, addr, P2pOp::Recv { peer, count }),
            };
            if peer.0 >= self.world {
                return Err(CommError::Invalid(format!(
                    "group operation {i}: rank {} is outside 0..{}",
                    peer.0, self.world
                )));
            }
            plan.push(p2p);
            addrs.push(addr);
        }
        let deadline = self.deadline(timeout);
        self.with_lane(device, deadline, |lane| {
            let seg = cut_group(dtype, &plan, lane.slot_len()).map_err(|e| CommError::Invalid(e.to_string()))?;
            // SAFETY: the caller's promise covers every operation's range.
            unsafe { lane.enqueue(stream, dtype, vec![seg], &addrs, &addrs, deadline) }
        })
    }

    fn deadline(&self, timeout: Option<Duration>) -> Instant {
        Instant::now() + timeout.unwrap_or_else(|| self.collective_timeout())
    }

    /// Run `f` on this communicator's lane for `device`, setting it up on first use.
    fn with_lane<D: Device>(
        &self,
        device: &Arc<D>,
        deadline: Instant,
        f: impl FnOnce(&Lane) -> Result<Receiver<Result<super::DeviceReport, CommError>>, CommError>,
    ) -> Result<DeviceHandle, CommError> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let mut lane = self.device.lock().unwrap_or_else(PoisonError::into_inner);
        let lane = match &mut *lane {
            Some(l) => l,
            empty => {
                let bytes = self.template.config.transport.device_staging_bytes;
                let slot = usize::try_from(bytes / SLOTS as u64)
                    .map_err(|_| CommError::Invalid(format!("{bytes} bytes of device staging do not fit in memory")))?;
                let device: Arc<dyn Device> = device.clone();
                empty.insert(Lane::new(device, self.submitter(), slot)?)
            }
        };
        if lane.device_id() != device.id() {
            return Err(CommError::Invalid(
                "this communicator stages for another device: use one device per communicator (as NCCL binds a communicator to one GPU)".into(),
            ));
        }
        let rx = f(lane)?;
        Ok(DeviceHandle { rx, give_up_at: deadline + REPLY_MARGIN, done: None })
    }
}
