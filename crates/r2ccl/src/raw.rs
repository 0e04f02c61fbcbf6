//! The byte-level layer: a collective as (collective, dtype, count, bytes), the entry points
//! the typed calls, the coming C ABI and the Python package build on.
//!
//! Buffer sizes follow [`Collective`]'s table; a buffer of the wrong size is
//! [`CommError::Invalid`]. Every call has a deadline (the communicator's
//! [`Communicator::collective_timeout`] unless given) and returns by it.

use crate::buffers::CommBuf;
use crate::call::{Access, Handle};
use crate::comm::{Bufs, Call, Communicator, Shared, Work};
use crate::error::CommError;
use crate::report::CollReport;
use r2ccl_algo::{Collective, P2pOp};
use r2ccl_core::{DType, Element, Rank};
use std::time::Duration;

/// One operation of [`Communicator::group_bytes`] (like `ncclSend` / `ncclRecv` between
/// `ncclGroupStart` and `ncclGroupEnd`).
#[derive(Debug)]
#[non_exhaustive]
pub enum P2p<'a> {
    /// Send `data` to rank `peer`.
    Send {
        /// The receiver.
        peer: Rank,
        /// The bytes (a whole number of elements).
        data: &'a [u8],
    },
    /// Receive into `buf` from rank `peer` (exactly `buf.len()` bytes).
    Recv {
        /// The sender.
        peer: Rank,
        /// Where the bytes go.
        buf: &'a mut [u8],
    },
}

impl Communicator {
    /// Run `call` and wait for it, by `timeout` (the communicator's timeout when `None`).
    pub(crate) fn block(&self, call: Call, timeout: Option<Duration>) -> Result<CollReport, CommError> {
        self.submit(call, timeout)?.wait().map(|(_, report)| report)
    }

    /// Start a collective on owned buffers without waiting: `input` is this rank's send
    /// buffer, `output` the receive buffer's current contents, sized as the collective needs.
    /// It must finish within `timeout` of now, or [`Handle::wait`] returns
    /// [`CommError::Timeout`].
    pub fn start(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        input: Vec<u8>,
        output: Vec<u8>,
        timeout: Duration,
    ) -> Result<Handle, CommError> {
        let call = Call { work: Work::Coll(coll), dtype, count, bufs: Bufs::Owned { input, output }, access: None };
        self.submit(call, Some(timeout)).map(Handle::new)
    }

    /// Start a collective of `count` elements of `dtype` on caller memory without waiting (the
    /// form a C ABI's `allReduce(sendbuff, recvbuff, count, ...)` needs): `send` and `recv` hold
    /// the sizes [`Collective`]'s table gives for this communicator's ranks; `send == recv` runs
    /// it in place (NCCL's convention). It must finish within `timeout` of now (the
    /// communicator's [`Communicator::collective_timeout`] when `None`); [`Handle::wait`]
    /// returns an empty output and the report.
    ///
    /// Buffers that each start at a live registered buffer of this communicator
    /// ([`Communicator::alloc`], [`Communicator::alloc_owned`]) and fit in it are read and
    /// written where they are, as [`Communicator::run_registered`] does (no copy in or out); any
    /// other memory is copied into the library and out of it.
    ///
    /// # Safety
    ///
    /// `send` must be valid for reads and `recv` for writes of those sizes, and neither may be
    /// written by anything else, until the handle's [`Handle::wait`] has returned or
    /// [`Handle::is_done`] has said `true` (dropping the handle does not end the call).
    pub unsafe fn start_raw(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        send: *const u8,
        recv: *mut u8,
        timeout: Option<Duration>,
    ) -> Result<Handle, CommError> {
        let (in_len, out_len) = r2ccl_algo::ScheduleRequest::new(coll, dtype, count)
            .buffer_lens(self.world as usize)
            .map_err(|e| CommError::Invalid(e.to_string()))?;
        let (in_len, out_len) = (usize::try_from(in_len), usize::try_from(out_len));
        let (Ok(in_len), Ok(out_len)) = (in_len, out_len) else {
            return Err(CommError::Invalid(format!("{} of {count} elements does not fit in memory", coll.name())));
        };
        let (bufs, access) = raw_bufs(&self.shared, send, recv, in_len, out_len);
        let call = Call { work: Work::Coll(coll), dtype, count, bufs, access };
        self.submit(call, timeout).map(Handle::new)
    }

    /// Run a collective of `count` elements of `dtype` and wait for it: `output` receives the
    /// result.
    pub fn run(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        input: &[u8],
        output: &mut [u8],
    ) -> Result<CollReport, CommError> {
        self.run_by(coll, dtype, count, input, output, None)
    }

    /// [`Communicator::run`] that must finish within `timeout` of now (not the communicator's
    /// [`Communicator::collective_timeout`]).
    pub fn run_within(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        input: &[u8],
        output: &mut [u8],
        timeout: Duration,
    ) -> Result<CollReport, CommError> {
        self.run_by(coll, dtype, count, input, output, Some(timeout))
    }

    fn run_by(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        input: &[u8],
        output: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<CollReport, CommError> {
        let bufs = Bufs::Borrowed {
            input: input.as_ptr(),
            in_len: input.len(),
            output: output.as_mut_ptr(),
            out_len: output.len(),
        };
        self.block(Call { work: Work::Coll(coll), dtype, count, bufs, access: Some(Access::new()) }, timeout)
    }

    /// Run a collective in place and wait for it (NCCL's convention: AllGather reads this
    /// rank's block of `buf`, ReduceScatter writes its result to this rank's block; the others
    /// read and write all of it). `buf` holds the larger of the input and the output.
    pub fn run_in_place(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        buf: &mut [u8],
    ) -> Result<CollReport, CommError> {
        let bufs = Bufs::InPlace { buf: buf.as_mut_ptr(), len: buf.len() };
        self.block(Call { work: Work::Coll(coll), dtype, count, bufs, access: Some(Access::new()) }, None)
    }

    /// Run a collective on registered memory and wait for it: it reads the first bytes of
    /// `input` and writes the first bytes of `output` where they are (each at least as long as
    /// the collective's buffer), with no copy in or out.
    pub fn run_registered<T: Element, U: Element>(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        input: &CommBuf<'_, T>,
        output: &mut CommBuf<'_, U>,
    ) -> Result<CollReport, CommError> {
        let mem = Some((input.as_ptr().cast::<u8>(), output.as_mut_ptr().cast::<u8>()));
        let bufs = Bufs::Registered {
            input: input.registration(&self.shared)?,
            output: output.registration(&self.shared)?,
            mem,
        };
        self.block(Call { work: Work::Coll(coll), dtype, count, bufs, access: None }, None)
    }

    /// As [`Communicator::run_in_place`], on registered memory read and written where it is.
    pub fn run_registered_in_place<T: Element>(
        &self,
        coll: Collective,
        dtype: DType,
        count: u64,
        buf: &mut CommBuf<'_, T>,
    ) -> Result<CollReport, CommError> {
        let mem = Some(buf.as_mut_ptr().cast::<u8>());
        let (buf, len) = buf.registration(&self.shared)?;
        let bufs = Bufs::RegisteredInPlace { buf, len, mem };
        self.block(Call { work: Work::Coll(coll), dtype, count, bufs, access: None }, None)
    }

    /// Start a group of point-to-point operations without waiting (the non-blocking form of
    /// [`Communicator::group_bytes`], for bindings): `input` holds the data of every
    /// [`P2pOp::Send`] in `ops`, one after another in their order; [`Handle::wait`] returns
    /// the data of every [`P2pOp::Recv`] the same way. It must finish within `timeout` of now
    /// (the communicator's [`Communicator::collective_timeout`] when `None`).
    pub fn start_group(
        &self,
        dtype: DType,
        ops: &[P2pOp],
        input: Vec<u8>,
        timeout: Option<Duration>,
    ) -> Result<Handle, CommError> {
        let elem = dtype.size() as u64;
        let (mut in_len, mut out_len) = (0u64, 0u64);
        for (i, op) in ops.iter().enumerate() {
            let (peer, count, total) = match op {
                P2pOp::Send { peer, count } => (*peer, *count, &mut in_len),
                P2pOp::Recv { peer, count } => (*peer, *count, &mut out_len),
            };
            if peer.0 >= self.world {
                return Err(CommError::Invalid(format!(
                    "group operation {i}: rank {} is outside 0..{}",
                    peer.0, self.world
                )));
            }
            *total = count.checked_mul(elem).and_then(|b| total.checked_add(b)).ok_or_else(|| {
                CommError::Invalid(format!("group operation {i}: {count} elements overflow the byte count"))
            })?;
        }
        if input.len() as u64 != in_len {
            return Err(CommError::Invalid(format!(
                "group input holds {} bytes; its sends need {in_len}",
                input.len()
            )));
        }
        let too_big = || CommError::Invalid(format!("group receives of {out_len} bytes do not fit in memory"));
        let out_len_usize = usize::try_from(out_len).map_err(|_| too_big())?;
        let mut output = Vec::new();
        output.try_reserve_exact(out_len_usize).map_err(|_| too_big())?;
        output.resize(out_len_usize, 0);
        let call = Call {
            work: Work::Group(ops.to_vec()),
            dtype,
            count: 0,
            bufs: Bufs::Owned { input, output },
            access: None,
        };
        self.submit(call, timeout).map(Handle::new)
    }

    /// Run a group of point-to-point operations on bytes of `dtype` and wait for all of them
    /// (NCCL's `ncclSend` and `ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`); the
    /// typed form is [`Communicator::group`], whose rules apply.
    pub fn group_bytes(&self, dtype: DType, ops: &mut [P2p<'_>]) -> Result<CollReport, CommError> {
        let elem = dtype.size();
        let mut plan = Vec::with_capacity(ops.len());
        let mut input = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let (peer, len) = match op {
                P2p::Send { peer, data } => (*peer, data.len()),
                P2p::Recv { peer, buf } => (*peer, buf.len()),
            };
            if len % elem != 0 {
                return Err(CommError::Invalid(format!(
                    "group operation {i}: {len} bytes is not a whole number of {dtype} elements"
                )));
            }
            let count = (len / elem) as u64;
            match op {
                P2p::Send { data, .. } => {
                    plan.push(P2pOp::Send { peer, count });
                    input.extend_from_slice(data);
                }
                P2p::Recv { .. } => plan.push(P2pOp::Recv { peer, count }),
            }
        }
        let (output, report) = self.start_group(dtype, &plan, input, None)?.wait()?;
        let mut at = 0;
        for op in ops.iter_mut() {
            if let P2p::Recv { buf, .. } = op {
                let src = output.get(at..at + buf.len()).ok_or_else(|| CommError::Failed {
                    seq: report.seq,
                    why: format!("group output holds {} bytes", output.len()),
                })?;
                buf.copy_from_slice(src);
                at += buf.len();
            }
        }
        Ok(report)
    }
}

/// What a raw-pointer call of `in_len` input and `out_len` output bytes runs on: the registered
/// buffers of this communicator its pointers start (each long enough; in place when they are
/// equal), read and written where they are; otherwise the caller's memory, copied in and out
/// under an [`Access`].
pub(crate) fn raw_bufs(
    shared: &Shared,
    send: *const u8,
    recv: *mut u8,
    in_len: usize,
    out_len: usize,
) -> (Bufs, Option<Access>) {
    let in_place = std::ptr::eq(send, recv);
    let registered = if in_place {
        shared.registration_at(recv as usize, in_len.max(out_len)).map(|(buf, len)| Bufs::RegisteredInPlace {
            buf,
            len,
            mem: Some(recv),
        })
    } else {
        let input = shared.registration_at(send as usize, in_len);
        let output = shared.registration_at(recv as usize, out_len);
        input.zip(output).map(|(input, output)| Bufs::Registered { input, output, mem: Some((send, recv)) })
    };
    match registered {
        Some(bufs) => (bufs, None),
        None if in_place => (Bufs::InPlace { buf: recv, len: in_len.max(out_len) }, Some(Access::new())),
        None => (Bufs::Borrowed { input: send, in_len, output: recv, out_len }, Some(Access::new())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use r2ccl_transport::MemHandle;

    fn kind(b: &Bufs) -> String {
        match b {
            Bufs::RegisteredInPlace { buf, len, .. } => format!("registered in place {} {len}", buf.0),
            Bufs::Registered { input, output, .. } => {
                format!("registered {} {} -> {} {}", input.0 .0, input.1, output.0 .0, output.1)
            }
            Bufs::InPlace { len, .. } => format!("copied in place {len}"),
            Bufs::Borrowed { in_len, out_len, .. } => format!("copied {in_len} -> {out_len}"),
            Bufs::Owned { .. } | Bufs::RegisteredAt { .. } => "other".into(),
        }
    }

    #[test]
    fn raw_pointers_that_start_registered_buffers_run_on_them_in_place() {
        let shared = Shared::default();
        let (a, b, c) = (vec![0u8; 64], vec![0u8; 256], vec![0u8; 64]);
        let (pa, pb, pc) = (a.as_ptr().cast_mut(), b.as_ptr().cast_mut(), c.as_ptr().cast_mut());
        shared.registered(pa as usize, 64, MemHandle(1));
        shared.registered(pb as usize, 256, MemHandle(2));
        let cases = [
            // (send, recv, in_len, out_len, what runs)
            (pa, pa, 64, 64, "registered in place 1 64"),
            (pa, pa, 32, 32, "registered in place 1 64"),
            (pa, pa, 16, 128, "copied in place 128"), // AllGather in place larger than the buffer
            (pa, pb, 64, 256, "registered 1 64 -> 2 256"),
            (pa, pc, 64, 64, "copied 64 -> 64"), // one side plain memory
            (pc, pb, 64, 64, "copied 64 -> 64"),
            (pa.wrapping_add(8), pa.wrapping_add(8), 8, 8, "copied in place 8"), // inside, not at the start
            (pc, pc, 64, 64, "copied in place 64"),
        ];
        for (send, recv, i, o, want) in cases {
            let (bufs, access) = raw_bufs(&shared, send, recv, i, o);
            assert_eq!(kind(&bufs), want, "{i} -> {o}");
            assert_eq!(access.is_some(), want.starts_with("copied"), "{want}");
        }
        // A freed buffer is caller memory again.
        shared.unregistered(pa as usize);
        assert_eq!(kind(&raw_bufs(&shared, pa, pa, 64, 64).0), "copied in place 64");
    }
}
