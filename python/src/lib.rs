//! `r2ccl._r2ccl`: the Python extension module under the `r2ccl` package (pyo3, abi3).
//!
//! What it does: binds [`r2ccl::Communicator`] for Python on raw host memory: a collective
//! or a group of sends and receives starts from addresses and byte counts and returns a
//! `Work` whose `wait` releases the GIL; errors become one exception class per
//! [`r2ccl::CommError`] variant; health events, the agreed failed-NIC set and the
//! Prometheus endpoint are readable. What it does not do: it never looks at Python objects'
//! memory itself. The pure-Python layer (`r2ccl/__init__.py`, `r2ccl/torch.py`) turns buffers
//! and tensors into addresses, checks their sizes, and keeps them alive until their work is
//! done; this module trusts those addresses.
//!
//! Example (Python; the package's tests run it across processes):
//!
//! ```text
//! import r2ccl, numpy as np
//! root = r2ccl.Root.create("127.0.0.1")
//! comm = r2ccl.Communicator(0, 1, root.unique_id(), nics=["lo", "lo"], root=root)
//! x = np.arange(4, dtype=np.float32)
//! comm.all_reduce(x)            # in place; a world of one leaves it as it is
//! comm.finalize()
//! ```

mod errors;

use errors::to_py;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use r2ccl::{Collective, CommError, DType, Handle, P2pOp, Rank, ReduceOp, UniqueId};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A lock that a panicking holder left poisoned is still usable: the state it guards is
/// only ever replaced whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn parse_dtype(s: &str) -> PyResult<DType> {
    s.parse::<DType>().map_err(|e| PyValueError::new_err(e.to_string()))
}

fn parse_op(s: Option<&str>) -> PyResult<ReduceOp> {
    s.unwrap_or("sum").parse::<ReduceOp>().map_err(|e| PyValueError::new_err(e.to_string()))
}

fn to_duration(seconds: Option<f64>) -> PyResult<Option<Duration>> {
    seconds
        .map(|s| Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("timeout {s} s"))))
        .transpose()
}

/// Rank 0's rendezvous: bound at creation, handed to rank 0's [`Communicator`].
#[pyclass(module = "r2ccl._r2ccl", frozen)]
struct Root {
    inner: Mutex<Option<r2ccl::Root>>,
    id: String,
}

#[pymethods]
impl Root {
    /// Bind a rendezvous listener on `ip` (port chosen by the OS) with a fresh random secret.
    #[staticmethod]
    fn create(ip: &str) -> PyResult<Self> {
        let ip: IpAddr = ip.parse().map_err(|e| PyValueError::new_err(format!("address `{ip}`: {e}")))?;
        let root = r2ccl::Root::create(ip).map_err(|e| to_py(CommError::Bootstrap(e.to_string())))?;
        let id = root.unique_id().map_err(|e| to_py(CommError::Bootstrap(e.to_string())))?.to_string();
        Ok(Self { inner: Mutex::new(Some(root)), id })
    }

    /// The unique id to give every rank (it holds the secret: share it only with them).
    fn unique_id(&self) -> String {
        self.id.clone()
    }

    fn __repr__(&self) -> String {
        "Root(<rendezvous; unique id hidden>)".to_owned()
    }
}

/// What a finished call reports besides its data.
#[pyclass(module = "r2ccl._r2ccl", frozen, get_all)]
#[derive(Clone)]
struct CollReport {
    /// The collective's sequence number on its communicator (1 for the first).
    seq: u64,
    /// How it was scheduled (a strategy name, `group`, `tree` or `balance`).
    strategy: String,
    /// The health epoch its plan used.
    epoch: u64,
    /// Seconds inside the progress thread.
    seconds: f64,
}

#[pymethods]
impl CollReport {
    fn __repr__(&self) -> String {
        format!(
            "CollReport(seq={}, strategy='{}', epoch={}, seconds={:.6})",
            self.seq, self.strategy, self.epoch, self.seconds
        )
    }
}

impl From<r2ccl::CollReport> for CollReport {
    fn from(r: r2ccl::CollReport) -> Self {
        Self { seq: r.seq, strategy: r.strategy.name().to_owned(), epoch: r.epoch, seconds: r.seconds }
    }
}

/// What a started call waits on.
enum Pending {
    /// A call on host memory; a group's receives are copied to the (address, length) pairs
    /// when it ends.
    Host(Handle, Vec<(usize, usize)>),
    /// A call on device memory, enqueued on its stream: done when its network part is.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code, reason = "made by `start_cuda` with the cuda feature only"))]
    Device(r2ccl::device::DeviceHandle),
}

impl Pending {
    fn is_done(&mut self) -> bool {
        match self {
            Pending::Host(h, _) => h.is_done(),
            Pending::Device(h) => h.is_done(),
        }
    }

    fn finish(self) -> Result<CollReport, CommError> {
        match self {
            Pending::Host(handle, scatter) => finish_call(handle, &scatter).map(CollReport::from),
            // A device call's report in the host calls' shape: its last segment's sequence
            // number and strategy, all its segments' time (epoch 0: segments may differ).
            Pending::Device(h) => h.wait().map(|r| CollReport {
                seq: r.seq,
                strategy: r.strategy.map_or_else(|| "none".to_owned(), |s| s.name().to_owned()),
                epoch: 0,
                seconds: r.seconds,
            }),
        }
    }
}

enum WorkState {
    /// Started. `keep` holds the Python objects that own the memory the call reads and writes.
    Running {
        pending: Pending,
        keep: Vec<PyObject>,
    },
    Done(Result<CollReport, CommError>),
    /// Between the two, inside [`Work::finish`] only.
    Finishing,
}

/// A started call. `wait` may be called from any thread and any number of times.
#[pyclass(module = "r2ccl._r2ccl", frozen)]
struct Work {
    state: Mutex<WorkState>,
}

impl Work {
    fn finish(state: &mut WorkState) {
        let WorkState::Running { .. } = state else { return };
        let WorkState::Running { pending, keep } = std::mem::replace(state, WorkState::Finishing) else {
            return;
        };
        let result = pending.finish();
        // The memory is no longer touched: its owners may go (their references are released
        // when this thread next holds the GIL, if it does not now).
        drop(keep);
        *state = WorkState::Done(result);
    }
}

/// Wait for `handle`, then copy a group's receives to `scatter` (address, length).
fn finish_call(handle: Handle, scatter: &[(usize, usize)]) -> Result<r2ccl::CollReport, CommError> {
    handle.wait().and_then(|(output, report)| {
        let mut at = 0usize;
        for &(addr, len) in scatter {
            let src = output.get(at..at + len).ok_or_else(|| CommError::Failed {
                seq: report.seq,
                why: format!("group output holds {} bytes, the receives {}", output.len(), at + len),
            })?;
            // SAFETY: the Python layer passed `addr` as a writable buffer of `len` bytes and
            // keeps its owner alive, and written by nothing else, until this work is done.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, len) };
            at += len;
        }
        Ok(report)
    })
}

impl Drop for Work {
    fn drop(&mut self) {
        // A call dropped before it finished still reads and writes its buffers: a reaper waits
        // for it (by its deadline) and only then lets the buffers' owners go.
        let state = std::mem::replace(
            self.state.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner),
            WorkState::Finishing,
        );
        if let WorkState::Running { pending, keep } = state {
            reaper().send((pending, keep));
        }
    }
}

/// A dropped call: what it waits on, the owners of its memory.
type Dropped = (Pending, Vec<PyObject>);

/// The reaper of dropped calls: one thread, started on first use.
struct Reaper(Mutex<std::sync::mpsc::Sender<Dropped>>);

impl Reaper {
    fn send(&self, item: Dropped) {
        if let Err(unsent) = lock(&self.0).send(item) {
            // No reaper thread could be started: leak the call's buffers rather than free
            // memory the call may still write.
            std::mem::forget(unsent.0);
        }
    }
}

fn reaper() -> &'static Reaper {
    static REAPER: std::sync::OnceLock<Reaper> = std::sync::OnceLock::new();
    REAPER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Dropped>();
        // If the thread cannot start, its receiver is dropped and every send leaks (see `send`).
        let _ = std::thread::Builder::new().name("r2ccl-reaper".into()).spawn(move || {
            for (pending, keep) in rx {
                let _ = pending.finish();
                drop(keep);
            }
        });
        Reaper(Mutex::new(tx))
    })
}

#[pymethods]
impl Work {
    /// Wait for the call (the GIL is released meanwhile); its report, or its exception.
    fn wait(&self, py: Python<'_>) -> PyResult<CollReport> {
        let result = py.allow_threads(|| {
            let mut state = lock(&self.state);
            Work::finish(&mut state);
            match &*state {
                WorkState::Done(r) => r.clone(),
                WorkState::Running { .. } | WorkState::Finishing => {
                    Err(CommError::Invalid("work still running after its wait".into()))
                }
            }
        });
        result.map_err(to_py)
    }

    /// Whether the call has finished (then `wait` returns at once); never blocks.
    fn is_done(&self) -> bool {
        let Ok(mut state) = self.state.try_lock() else { return false };
        let finished = match &mut *state {
            WorkState::Done(_) => return true,
            WorkState::Running { pending, .. } => pending.is_done(),
            WorkState::Finishing => false,
        };
        if finished {
            // Done: finishing does not block, and copies a group's receives into place, so
            // that what the caller reads next is the result.
            Work::finish(&mut state);
        }
        finished
    }
}

/// Enqueue a collective on CUDA memory (a build with the `cuda` feature).
#[cfg(feature = "cuda")]
fn start_cuda(
    comm: &r2ccl::Communicator,
    coll: Collective,
    dtype: DType,
    count: u64,
    (send, recv): (usize, usize),
    stream: usize,
    timeout: Option<Duration>,
) -> Result<Pending, CommError> {
    // SAFETY: the Python layer's contract (as `start`): device memory of those sizes, alive and
    // untouched by anything else until the stream has run past the call; `stream` a live
    // stream of the thread's current context.
    let h = unsafe { comm.start_cuda_raw(coll, dtype, count, send as u64, recv as u64, stream as _, timeout) }?;
    Ok(Pending::Device(h))
}

/// Without the `cuda` feature: the named error.
#[cfg(not(feature = "cuda"))]
fn start_cuda(
    _comm: &r2ccl::Communicator,
    _coll: Collective,
    _dtype: DType,
    _count: u64,
    _bufs: (usize, usize),
    _stream: usize,
    _timeout: Option<Duration>,
) -> Result<Pending, CommError> {
    Err(CommError::Device(r2ccl::device::DeviceError::Unsupported(
        "this build of r2ccl has no CUDA support (build the package with the `cuda` feature)".into(),
    )))
}

/// Memory registered with every NIC of one communicator (`Communicator.alloc`): a call whose
/// buffers each start at one of these (as a tensor over all of it does) reads and writes it in
/// place, with no copy into the library or out of it. Freed by `free()` or when the last
/// reference goes (a tensor made over it holds one).
#[pyclass(module = "r2ccl._r2ccl", frozen)]
struct RegisteredBuffer {
    buf: Mutex<Option<r2ccl::CommBuf<'static, u8>>>,
    addr: usize,
    nbytes: usize,
}

#[pymethods]
impl RegisteredBuffer {
    /// The address of its first byte.
    #[getter]
    fn addr(&self) -> usize {
        self.addr
    }

    /// Its length in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Free it now (later frees do nothing). Nothing may use its memory afterwards.
    fn free(&self) {
        drop(lock(&self.buf).take());
    }
}

/// One rank's communicator.
#[pyclass(module = "r2ccl._r2ccl", frozen)]
struct Communicator {
    inner: Mutex<Option<Arc<r2ccl::Communicator>>>,
    rank: u32,
    world: u32,
}

impl Communicator {
    /// Parse and check a collective's arguments against the buffers' sizes (`send == recv`:
    /// in place, one buffer of the larger extent).
    #[allow(clippy::too_many_arguments)] // reason: the arguments of `start`, checked in one place
    fn checked(
        &self,
        coll: &str,
        dtype: &str,
        count: u64,
        (send, send_nbytes): (usize, usize),
        (recv, recv_nbytes): (usize, usize),
        op: Option<&str>,
        root: u32,
    ) -> PyResult<(Collective, DType, Arc<r2ccl::Communicator>)> {
        let op = parse_op(op)?;
        let root = Rank(root);
        let coll = match coll {
            "all_reduce" => Collective::AllReduce { op },
            "reduce_scatter" => Collective::ReduceScatter { op },
            "all_gather" => Collective::AllGather,
            "broadcast" => Collective::Broadcast { root },
            "reduce" => Collective::Reduce { op, root },
            "all_to_all" => Collective::AlltoAll,
            other => return Err(PyValueError::new_err(format!("unknown collective `{other}`"))),
        };
        if send == 0 || recv == 0 {
            return Err(PyValueError::new_err("a null buffer address"));
        }
        let dtype = parse_dtype(dtype)?;
        let comm = self.get()?;
        // The extents the call reads and writes, against what the buffers hold.
        let (in_len, out_len) = r2ccl_algo::ScheduleRequest::new(coll, dtype, count)
            .buffer_lens(comm.world() as usize)
            .map_err(|e| to_py(CommError::Invalid(e.to_string())))?;
        let (need_send, need_recv) =
            if send == recv { (in_len.max(out_len), in_len.max(out_len)) } else { (in_len, out_len) };
        if (send_nbytes as u64) < need_send || (recv_nbytes as u64) < need_recv {
            return Err(to_py(CommError::Invalid(format!(
                "{} of {count} {dtype} elements needs {need_send} bytes to send and {need_recv} to receive{}; \
                 the buffers hold {send_nbytes} and {recv_nbytes}",
                coll.name(),
                if send == recv { " (in place: one buffer)" } else { "" },
            ))));
        }
        Ok((coll, dtype, comm))
    }

    fn get(&self) -> PyResult<Arc<r2ccl::Communicator>> {
        lock(&self.inner).clone().ok_or_else(|| to_py(CommError::Invalid("the communicator was finalized".into())))
    }

    fn wrap(comm: r2ccl::Communicator) -> Self {
        let (rank, world) = (comm.rank().0, comm.world());
        Self { inner: Mutex::new(Some(Arc::new(comm))), rank, world }
    }
}

#[pymethods]
impl Communicator {
    /// Join `world` ranks at `unique_id` as `rank` (blocks, GIL released, until every rank
    /// has joined or the bootstrap deadline passes). `node` defaults to the host name, `nics`
    /// to the configured or discovered data NICs; rank 0 passes its `root`. The configuration
    /// comes from `R2CCL_*` and `R2CCL_CONFIG`, as for Rust programs. `fault_injection_from_env`
    /// reads `R2CCL_FAULT` (for tests only).
    #[new]
    #[pyo3(signature = (rank, world, unique_id, node=None, nics=None, root=None, fault_injection_from_env=false))]
    #[allow(clippy::too_many_arguments)] // reason: Python's keyword arguments, one per builder setting
    fn new(
        py: Python<'_>,
        rank: u32,
        world: u32,
        unique_id: &str,
        node: Option<String>,
        nics: Option<Vec<String>>,
        root: Option<&Root>,
        fault_injection_from_env: bool,
    ) -> PyResult<Self> {
        let id: UniqueId = unique_id
            .parse()
            .map_err(|e: r2ccl::bootstrap::UniqueIdError| to_py(CommError::Invalid(format!("unique id: {e}"))))?;
        let config = r2ccl_config::load().map_err(|e| to_py(CommError::Invalid(e.to_string())))?;
        let mut b = r2ccl::Communicator::builder(Rank(rank), world, id)
            .config(config)
            .fault_injection_from_env(fault_injection_from_env);
        if let Some(node) = node {
            b = b.node(node);
        }
        if let Some(nics) = nics {
            b = b.nics(nics);
        }
        if let Some(root) = root {
            let taken = lock(&root.inner).take();
            if taken.is_none() {
                return Err(PyValueError::new_err("this Root was already given to a communicator"));
            }
            b = b.root(taken);
        }
        let comm = py.allow_threads(|| b.init()).map_err(to_py)?;
        Ok(Self::wrap(comm))
    }

    /// A communicator from the launcher's environment (`R2CCL_UNIQUE_ID`, `R2CCL_*`,
    /// OpenMPI, Slurm, torchrun).
    #[staticmethod]
    fn from_env(py: Python<'_>) -> PyResult<Self> {
        let comm = py.allow_threads(r2ccl::Communicator::from_env).map_err(to_py)?;
        Ok(Self::wrap(comm))
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> u32 {
        self.rank
    }

    /// The number of ranks.
    #[getter]
    fn world(&self) -> u32 {
        self.world
    }

    /// The default deadline of a call, in seconds.
    #[getter]
    fn collective_timeout(&self) -> PyResult<f64> {
        Ok(self.get()?.collective_timeout().as_secs_f64())
    }

    /// `nbytes` zeroed bytes registered with every NIC of this rank (page-aligned). A call whose
    /// buffers each start at such a buffer of this communicator and fit in it runs there in
    /// place; other memory is copied into the library and out of it.
    fn alloc(&self, py: Python<'_>, nbytes: usize) -> PyResult<RegisteredBuffer> {
        if nbytes == 0 {
            return Err(to_py(CommError::Invalid("a registered buffer needs at least one byte".into())));
        }
        let comm = self.get()?;
        let buf = py.allow_threads(|| comm.alloc_owned::<u8>(nbytes)).map_err(to_py)?;
        let addr = buf.as_ptr() as usize;
        Ok(RegisteredBuffer { buf: Mutex::new(Some(buf)), addr, nbytes })
    }

    /// The node of every rank, by rank.
    fn nodes(&self) -> PyResult<Vec<u32>> {
        Ok(self.get()?.nodes().into_iter().map(|n| n.0).collect())
    }

    /// Start collective `coll` (`all_reduce`, `reduce_scatter`, `all_gather`, `broadcast`,
    /// `reduce`, `all_to_all`) of `count` elements of `dtype` from address `send` (of
    /// `send_nbytes` bytes) into address `recv` (of `recv_nbytes`; equal addresses: in place);
    /// buffers smaller than the collective needs are refused. `keep` lists the objects that
    /// own that memory: the work holds them until the call is done, even if it is dropped.
    ///
    /// Safety, for the Python layer: the addresses must be valid for those sizes while
    /// `keep`'s objects live, and untouched by anything else until the work is done.
    #[pyo3(signature = (coll, dtype, count, send, send_nbytes, recv, recv_nbytes, keep, op=None, root=0, timeout=None))]
    #[allow(clippy::too_many_arguments)] // reason: the C-style signature bindings call
    fn start(
        &self,
        coll: &str,
        dtype: &str,
        count: u64,
        send: usize,
        send_nbytes: usize,
        recv: usize,
        recv_nbytes: usize,
        keep: Vec<PyObject>,
        op: Option<&str>,
        root: u32,
        timeout: Option<f64>,
    ) -> PyResult<Work> {
        let (coll, dtype, comm) =
            self.checked(coll, dtype, count, (send, send_nbytes), (recv, recv_nbytes), op, root)?;
        // SAFETY: the caller's contract above; the extents were checked against the buffers.
        let handle =
            unsafe { comm.start_raw(coll, dtype, count, send as *const u8, recv as *mut u8, to_duration(timeout)?) }
                .map_err(to_py)?;
        Ok(Work { state: Mutex::new(WorkState::Running { pending: Pending::Host(handle, Vec::new()), keep }) })
    }

    /// As `start`, on CUDA device memory, enqueued on `stream` (a `cudaStream_t` of the calling
    /// thread's current context, as `torch.cuda.current_stream().cuda_stream`; 0 is the legacy
    /// default stream): the call returns once the work is on the stream; later work on it sees
    /// the result. `DeviceError` without a CUDA driver or in a build without CUDA support.
    #[pyo3(signature = (coll, dtype, count, send, send_nbytes, recv, recv_nbytes, stream, keep, op=None, root=0, timeout=None))]
    #[allow(clippy::too_many_arguments)] // reason: the C-style signature bindings call
    fn start_cuda(
        &self,
        coll: &str,
        dtype: &str,
        count: u64,
        send: usize,
        send_nbytes: usize,
        recv: usize,
        recv_nbytes: usize,
        stream: usize,
        keep: Vec<PyObject>,
        op: Option<&str>,
        root: u32,
        timeout: Option<f64>,
    ) -> PyResult<Work> {
        let (coll, dtype, comm) =
            self.checked(coll, dtype, count, (send, send_nbytes), (recv, recv_nbytes), op, root)?;
        let timeout = to_duration(timeout)?;
        let pending = start_cuda(&comm, coll, dtype, count, (send, recv), stream, timeout).map_err(to_py)?;
        Ok(Work { state: Mutex::new(WorkState::Running { pending, keep }) })
    }

    /// Start a group of sends and receives of `dtype` elements: `ops` lists
    /// `(is_send, peer, address, nbytes)`. Sends are copied now; receives are written when the
    /// work is waited for (or found done). `keep` lists the objects that own the receive
    /// buffers, held until then. Every rank of the communicator calls it at the same point.
    #[pyo3(signature = (dtype, ops, keep, timeout=None))]
    fn start_group(
        &self,
        dtype: &str,
        ops: Vec<(bool, u32, usize, usize)>,
        keep: Vec<PyObject>,
        timeout: Option<f64>,
    ) -> PyResult<Work> {
        let dtype = parse_dtype(dtype)?;
        let elem = dtype.size();
        let mut plan = Vec::with_capacity(ops.len());
        let mut input = Vec::new();
        let mut scatter = Vec::new();
        for (i, &(is_send, peer, addr, len)) in ops.iter().enumerate() {
            if len % elem != 0 {
                return Err(PyValueError::new_err(format!(
                    "group operation {i}: {len} bytes is not a whole number of {dtype} elements"
                )));
            }
            if addr == 0 && len > 0 {
                return Err(PyValueError::new_err(format!("group operation {i}: a null buffer address")));
            }
            let (peer, count) = (Rank(peer), (len / elem) as u64);
            if is_send {
                if len > 0 {
                    // SAFETY: the Python layer passes a readable buffer of `len` bytes.
                    input.extend_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, len) });
                }
                plan.push(P2pOp::Send { peer, count });
            } else {
                plan.push(P2pOp::Recv { peer, count });
                scatter.push((addr, len));
            }
        }
        let handle = self.get()?.start_group(dtype, &plan, input, to_duration(timeout)?).map_err(to_py)?;
        Ok(Work { state: Mutex::new(WorkState::Running { pending: Pending::Host(handle, scatter), keep }) })
    }

    /// The NICs every rank agreed are failed, as `(node, rail)` pairs.
    fn failed_nics(&self) -> PyResult<Vec<(u32, u16)>> {
        Ok(self.get()?.failed_nics().into_iter().map(|n| (n.node.0, n.rail.0)).collect())
    }

    /// Failover and health events since the last call, as `(milliseconds, text)`.
    fn take_events(&self) -> PyResult<Vec<(u64, String)>> {
        Ok(self.get()?.take_events().into_iter().map(|e| (e.at_ms, e.text)).collect())
    }

    /// Raise the communicator's asynchronous error (a lost peer, an abort), if it has one.
    fn check_async_error(&self) -> PyResult<()> {
        match self.get()?.async_error() {
            Some(e) => Err(to_py(e)),
            None => Ok(()),
        }
    }

    /// Abort: every rank's running and future calls fail with `reason`; never blocks.
    #[pyo3(signature = (reason="aborted from Python"))]
    fn abort(&self, reason: &str) -> PyResult<()> {
        self.get()?.abort(reason);
        Ok(())
    }

    /// Leave gracefully once every started call is done (GIL released). Later calls raise.
    fn finalize(&self, py: Python<'_>) -> PyResult<()> {
        let Some(comm) = lock(&self.inner).take() else { return Ok(()) };
        py.allow_threads(|| match Arc::try_unwrap(comm) {
            Ok(comm) => comm.finalize(),
            Err(shared) => {
                // A call is being started on another thread right now: abort rather than wait.
                shared.abort("finalized while a call was being started");
                Ok(())
            }
        })
        .map_err(to_py)
    }

    /// Leave at once: unfinished calls fail with `AbortedError`; peers are not waited for.
    fn destroy(&self, py: Python<'_>) {
        if let Some(comm) = lock(&self.inner).take() {
            py.allow_threads(|| match Arc::try_unwrap(comm) {
                Ok(comm) => comm.destroy(),
                Err(shared) => shared.abort("destroyed"),
            });
        }
    }

    fn __repr__(&self) -> String {
        format!("Communicator(rank={}, world={})", self.rank, self.world)
    }
}

/// Serve Prometheus metrics on `addr` (`"host:port"`, port 0 for any); returns the bound
/// address. At most once per process.
#[pyfunction]
fn install_prometheus(addr: &str) -> PyResult<String> {
    let addr: SocketAddr = addr.parse().map_err(|e| PyValueError::new_err(format!("address `{addr}`: {e}")))?;
    let (bound, handle) = r2ccl::install_prometheus(addr).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    // The handle renders on demand; the server thread holds what it needs.
    drop(handle);
    Ok(bound.to_string())
}

/// The UCX version this module was built against and the one loaded, as strings.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// Install r2ccl's log subscriber (`R2CCL_DEBUG`, `R2CCL_DEBUG_SUBSYS`, `R2CCL_DEBUG_FILE`, as
/// in Rust programs that call `r2ccl_log::init`), unless the configuration is invalid (the first
/// communicator then says why) or the process has a subscriber already.
fn init_logging() {
    let Ok(cfg) = r2ccl_config::load() else { return };
    if let Ok(spec) = r2ccl_log::LogSpec::parse(&cfg.log.level, &cfg.log.subsys, &cfg.log.file) {
        let _ = r2ccl_log::init(&spec);
    }
}

#[pymodule]
fn _r2ccl(m: &Bound<'_, PyModule>) -> PyResult<()> {
    init_logging();
    m.add_class::<Root>()?;
    m.add_class::<Communicator>()?;
    m.add_class::<RegisteredBuffer>()?;
    m.add_class::<Work>()?;
    m.add_class::<CollReport>()?;
    m.add_function(wrap_pyfunction!(install_prometheus, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    errors::register(m)
}
