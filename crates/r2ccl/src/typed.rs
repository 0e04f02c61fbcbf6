//! The typed calls: every collective on [`SendBuf`]/[`RecvBuf`] memory of any element type,
//! blocking on [`Communicator`] and non-blocking on [`crate::Scope`] (the same methods,
//! generated once by [`typed_collectives!`]), and grouped send/recv through [`Group`].
//!
//! Sizes are checked here, before anything is sent: a wrong size is [`CommError::Invalid`] and
//! leaves the communicator usable. The element type gives the dtype; `count` is derived from
//! the buffers, with `p` ranks:
//!
//! | call | send | recv | in place: `buf` |
//! |---|---|---|---|
//! | `all_reduce`, `broadcast`, `reduce` | n | n | n |
//! | `all_gather` | n | p x n | p x n (this rank's block is its input) |
//! | `reduce_scatter` | p x n | n | p x n (this rank's block gets the result) |
//! | `all_to_all` | p x n | p x n | p x n |

use crate::buffers::sealed::View;
use crate::buffers::{RecvBuf, SendBuf};
use crate::call::Access;
use crate::comm::{Bufs, Call, Communicator, Work};
use crate::error::CommError;
use crate::raw::P2p;
use crate::report::CollReport;
use r2ccl_algo::Collective;
use r2ccl_core::{DType, Element, Rank, ReduceOp};

/// How a collective's buffers relate (see the module table).
#[derive(Clone, Copy)]
pub(crate) enum Sizes {
    /// Input and output of `n` elements.
    Same,
    /// Output `p` times the input.
    Gather,
    /// Input `p` times the output.
    Scatter,
    /// Input and output of `p` blocks.
    Blocks,
}

impl Communicator {
    /// A call on separate send and receive buffers, checked.
    pub(crate) fn two(
        &self,
        coll: Collective,
        dtype: DType,
        send: View,
        recv: View,
        sizes: Sizes,
    ) -> Result<Call, CommError> {
        let p = self.world as usize;
        let (s, r) = (send.count, recv.count);
        let (ok, count, want) = match sizes {
            Sizes::Same => (s == r, s, "equal lengths"),
            Sizes::Gather => (r == s * p, s, "recv = ranks x send"),
            Sizes::Scatter => (s == r * p, r, "send = ranks x recv"),
            Sizes::Blocks => (s == r && s % p == 0, s / p, "equal lengths, a multiple of the ranks"),
        };
        if !ok {
            return Err(CommError::Invalid(format!(
                "{}: send holds {s} and recv {r} elements of {dtype} on {p} ranks; it needs {want}",
                coll.name()
            )));
        }
        let (si, ri) = (send.registration(&self.shared)?, recv.registration(&self.shared)?);
        let (bufs, access) = match (si, ri) {
            (Some(i), Some(o)) => {
                let mem = Some((send.ptr.cast_const(), recv.ptr));
                (Bufs::Registered { input: (i, send.bytes), output: (o, recv.bytes), mem }, None)
            }
            _ => (
                Bufs::Borrowed { input: send.ptr, in_len: send.bytes, output: recv.ptr, out_len: recv.bytes },
                Some(Access::new()),
            ),
        };
        Ok(Call { work: Work::Coll(coll), dtype, count: count as u64, bufs, access })
    }

    /// A call on one buffer, in place, checked.
    pub(crate) fn one(&self, coll: Collective, dtype: DType, buf: View, sizes: Sizes) -> Result<Call, CommError> {
        let p = self.world as usize;
        let n = buf.count;
        let count = match sizes {
            Sizes::Same => n,
            Sizes::Gather | Sizes::Scatter | Sizes::Blocks if n.is_multiple_of(p) => n / p,
            _ => {
                return Err(CommError::Invalid(format!(
                    "{} in place: {n} elements of {dtype} is not a multiple of the {p} ranks",
                    coll.name()
                )))
            }
        };
        let (bufs, access) = match buf.registration(&self.shared)? {
            Some(h) => (Bufs::RegisteredInPlace { buf: h, len: buf.bytes, mem: Some(buf.ptr) }, None),
            None => (Bufs::InPlace { buf: buf.ptr, len: buf.bytes }, Some(Access::new())),
        };
        Ok(Call { work: Work::Coll(coll), dtype, count: count as u64, bufs, access })
    }

    /// Hand a checked call over and wait for it (the blocking form of the typed calls).
    fn finish(&self, call: Call) -> Result<CollReport, CommError> {
        self.block(call, None)
    }

    fn comm(&self) -> &Communicator {
        self
    }
}

/// The typed collectives, for an impl whose `comm()` is the communicator and whose
/// `finish(call)` turns a checked call into `$ret`; `$lt` is the lifetime the buffers must
/// outlive.
macro_rules! typed_collectives {
    ($lt:lifetime, $ret:ty) => {
        /// AllReduce: `recv` gets the reduction of every rank's `send` (equal lengths).
        pub fn all_reduce<S, R>(&$lt self, send: &$lt S, recv: &$lt mut R, op: ReduceOp) -> Result<$ret, CommError>
        where
            S: SendBuf + ?Sized,
            R: RecvBuf<Elem = S::Elem> + ?Sized,
        {
            let call = self.comm().two(Collective::AllReduce { op }, S::Elem::DTYPE, send.view(), recv.view(), Sizes::Same)?;
            self.finish(call)
        }

        /// AllReduce in place.
        pub fn all_reduce_in_place<B: RecvBuf + ?Sized>(&$lt self, buf: &$lt mut B, op: ReduceOp) -> Result<$ret, CommError> {
            let call = self.comm().one(Collective::AllReduce { op }, B::Elem::DTYPE, buf.view(), Sizes::Same)?;
            self.finish(call)
        }

        /// AllGather: `recv` (ranks x `send.len()`) gets every rank's `send`, in rank order.
        pub fn all_gather<S, R>(&$lt self, send: &$lt S, recv: &$lt mut R) -> Result<$ret, CommError>
        where
            S: SendBuf + ?Sized,
            R: RecvBuf<Elem = S::Elem> + ?Sized,
        {
            let call = self.comm().two(Collective::AllGather, S::Elem::DTYPE, send.view(), recv.view(), Sizes::Gather)?;
            self.finish(call)
        }

        /// AllGather in place: this rank's block of `buf` is its input.
        pub fn all_gather_in_place<B: RecvBuf + ?Sized>(&$lt self, buf: &$lt mut B) -> Result<$ret, CommError> {
            let call = self.comm().one(Collective::AllGather, B::Elem::DTYPE, buf.view(), Sizes::Gather)?;
            self.finish(call)
        }

        /// ReduceScatter: rank j's `recv` gets block j of the reduction of every rank's `send`
        /// (ranks x `recv.len()`).
        pub fn reduce_scatter<S, R>(&$lt self, send: &$lt S, recv: &$lt mut R, op: ReduceOp) -> Result<$ret, CommError>
        where
            S: SendBuf + ?Sized,
            R: RecvBuf<Elem = S::Elem> + ?Sized,
        {
            let coll = Collective::ReduceScatter { op };
            let call = self.comm().two(coll, S::Elem::DTYPE, send.view(), recv.view(), Sizes::Scatter)?;
            self.finish(call)
        }

        /// ReduceScatter in place: this rank's block of `buf` gets its result.
        pub fn reduce_scatter_in_place<B: RecvBuf + ?Sized>(&$lt self, buf: &$lt mut B, op: ReduceOp) -> Result<$ret, CommError> {
            let call = self.comm().one(Collective::ReduceScatter { op }, B::Elem::DTYPE, buf.view(), Sizes::Scatter)?;
            self.finish(call)
        }

        /// Broadcast: every rank's `recv` gets `root`'s `send` (equal lengths on every rank).
        pub fn broadcast<S, R>(&$lt self, send: &$lt S, recv: &$lt mut R, root: Rank) -> Result<$ret, CommError>
        where
            S: SendBuf + ?Sized,
            R: RecvBuf<Elem = S::Elem> + ?Sized,
        {
            let coll = Collective::Broadcast { root };
            let call = self.comm().two(coll, S::Elem::DTYPE, send.view(), recv.view(), Sizes::Same)?;
            self.finish(call)
        }

        /// Broadcast in place: every rank's `buf` gets `root`'s.
        pub fn broadcast_in_place<B: RecvBuf + ?Sized>(&$lt self, buf: &$lt mut B, root: Rank) -> Result<$ret, CommError> {
            let call = self.comm().one(Collective::Broadcast { root }, B::Elem::DTYPE, buf.view(), Sizes::Same)?;
            self.finish(call)
        }

        /// Reduce: `root`'s `recv` gets the reduction of every rank's `send`; other ranks'
        /// `recv` is left unspecified.
        pub fn reduce<S, R>(&$lt self, send: &$lt S, recv: &$lt mut R, op: ReduceOp, root: Rank) -> Result<$ret, CommError>
        where
            S: SendBuf + ?Sized,
            R: RecvBuf<Elem = S::Elem> + ?Sized,
        {
            let coll = Collective::Reduce { op, root };
            let call = self.comm().two(coll, S::Elem::DTYPE, send.view(), recv.view(), Sizes::Same)?;
            self.finish(call)
        }

        /// Reduce in place.
        pub fn reduce_in_place<B: RecvBuf + ?Sized>(&$lt self, buf: &$lt mut B, op: ReduceOp, root: Rank) -> Result<$ret, CommError> {
            let call = self.comm().one(Collective::Reduce { op, root }, B::Elem::DTYPE, buf.view(), Sizes::Same)?;
            self.finish(call)
        }

        /// AlltoAll: block i of rank j's `recv` is block j of rank i's `send` (each of ranks
        /// blocks).
        pub fn all_to_all<S, R>(&$lt self, send: &$lt S, recv: &$lt mut R) -> Result<$ret, CommError>
        where
            S: SendBuf + ?Sized,
            R: RecvBuf<Elem = S::Elem> + ?Sized,
        {
            let call = self.comm().two(Collective::AlltoAll, S::Elem::DTYPE, send.view(), recv.view(), Sizes::Blocks)?;
            self.finish(call)
        }

        /// AlltoAll in place.
        pub fn all_to_all_in_place<B: RecvBuf + ?Sized>(&$lt self, buf: &$lt mut B) -> Result<$ret, CommError> {
            let call = self.comm().one(Collective::AlltoAll, B::Elem::DTYPE, buf.view(), Sizes::Blocks)?;
            self.finish(call)
        }
    };
}
pub(crate) use typed_collectives;

/// Blocking typed collectives: each returns when this rank's part is done, by the
/// communicator's [`Communicator::collective_timeout`].
impl Communicator {
    typed_collectives!('_, CollReport);

    /// Run a group of sends and receives and wait for all of them (NCCL's `ncclSend` and
    /// `ncclRecv` between `ncclGroupStart` and `ncclGroupEnd`): `build` lists them on a
    /// [`Group`], and every operation is in flight at once, so their order does not matter
    /// for deadlock.
    ///
    /// The k-th send from rank A to rank B pairs with B's k-th receive from A, and both must
    /// have the same length; a send to oneself pairs with a receive from oneself. Like a
    /// collective, a group is a step of the communicator's sequence: every rank calls `group`
    /// at the same point (a rank with nothing to do lists nothing), and ranks whose operations
    /// do not mirror each other all get [`CommError::Mismatch`] naming the pair. Every
    /// operation of a group has the same element type.
    pub fn group<'a>(&self, build: impl FnOnce(&mut Group<'a>)) -> Result<CollReport, CommError> {
        let mut g = Group { dtype: None, ops: Vec::new(), error: None };
        build(&mut g);
        if let Some(e) = g.error {
            return Err(e);
        }
        self.group_bytes(g.dtype.unwrap_or(DType::U8), &mut g.ops)
    }
}

/// The sends and receives of one [`Communicator::group`] call.
#[derive(Debug)]
pub struct Group<'a> {
    dtype: Option<DType>,
    ops: Vec<P2p<'a>>,
    error: Option<CommError>,
}

impl<'a> Group<'a> {
    fn check<T: Element>(&mut self) -> bool {
        match self.dtype {
            Some(d) if d != T::DTYPE && self.error.is_none() => {
                self.error = Some(CommError::Invalid(format!("a group of {d} cannot also move {}", T::DTYPE)));
            }
            _ => self.dtype = Some(T::DTYPE),
        }
        self.error.is_none()
    }

    /// Send `data` to `peer`.
    pub fn send<T: Element>(&mut self, data: &'a [T], peer: Rank) -> &mut Self {
        if self.check::<T>() {
            self.ops.push(P2p::Send { peer, data: bytemuck::cast_slice(data) });
        }
        self
    }

    /// Receive exactly `buf.len()` elements from `peer` into `buf`.
    pub fn recv<T: Element>(&mut self, buf: &'a mut [T], peer: Rank) -> &mut Self {
        if self.check::<T>() {
            self.ops.push(P2p::Recv { peer, buf: bytemuck::cast_slice_mut(buf) });
        }
        self
    }
}
