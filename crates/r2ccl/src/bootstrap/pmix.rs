//! The unique id through PMIx: under a PMIx launcher (OpenMPI's `mpirun`, PRRTE, Slurm with PMIx)
//! with no rendezvous address set, rank 0 binds the rendezvous with a fresh random secret and
//! publishes its unique id in the launcher's key-value store; every rank reads it after a fence.
//! No `-x R2CCL_ROOT`, and no secret derived from public job facts.
//!
//! `libpmix.so.2` is loaded at run time (`dlopen`), so nothing links PMIx and a machine without
//! it simply has no PMIx path. Only four calls of the stable PMIx client API are used (`Init`,
//! `Put`/`Commit`, `Fence`, `Get`, `Finalize`) with the layouts every PMIx from v2 on shares
//! (`pmix_proc_t`, and `pmix_value_t` holding a string). The exchange runs once per process,
//! on a thread bounded by a deadline (a rank that never joins the fence is an error, not a hang).

use super::{Root, UniqueId};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The key rank 0 publishes its unique id under (PMIx keys are at most 511 bytes).
const KEY: &str = "r2ccl.unique_id";
/// `PMIX_GLOBAL`: visible to every process of the job, on every node.
const PMIX_GLOBAL: u8 = 3;
/// `PMIX_STRING`: a NUL-terminated string.
const PMIX_STRING: u16 = 3;
/// `PMIX_MAX_NSLEN + 1`.
const NSLEN: usize = 256;

/// `pmix_proc_t`.
#[repr(C)]
struct PmixProc {
    nspace: [c_char; NSLEN],
    rank: u32,
}

/// `pmix_value_t` reduced to what a string value needs: the type, then the data union (8-byte
/// aligned, at least 24 bytes in every PMIx from v2 on; only its first pointer is read here).
#[repr(C)]
struct PmixValue {
    kind: u16,
    data: [*mut c_void; 3],
}

type InitFn = unsafe extern "C" fn(*mut PmixProc, *const c_void, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut PmixValue) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const PmixProc, usize, *const c_void, usize) -> c_int;
type GetFn = unsafe extern "C" fn(*const PmixProc, *const c_char, *const c_void, usize, *mut *mut PmixValue) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const c_void, usize) -> c_int;

/// Whether the environment says a PMIx server serves this process.
pub(crate) fn launched_by_pmix(env: &std::collections::BTreeMap<String, String>) -> bool {
    env.contains_key("PMIX_NAMESPACE") && env.contains_key("PMIX_RANK")
}

/// The exchange's result, once per process: the unique id, or why there is none.
static EXCHANGED: OnceLock<Result<UniqueId, String>> = OnceLock::new();
/// Rank 0's bound rendezvous, until its communicator takes it.
static ROOT: Mutex<Option<Root>> = Mutex::new(None);

/// The job's unique id through PMIx (rank 0 creates and publishes it), waiting at most
/// `deadline` for every rank to reach the fence. Later calls return the first result.
pub(crate) fn unique_id(deadline: Duration) -> Result<UniqueId, String> {
    EXCHANGED
        .get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new().name("r2ccl-pmix".into()).spawn(move || {
                let _ = tx.send(exchange());
            });
            if let Err(e) = spawned {
                return Err(format!("starting the PMIx thread: {e}"));
            }
            match rx.recv_timeout(deadline) {
                Ok(Ok((id, root))) => {
                    if let (Some(root), Ok(mut slot)) = (root, ROOT.lock()) {
                        *slot = Some(root);
                    }
                    Ok(id)
                }
                Ok(Err(e)) => Err(e),
                Err(_) => Err(format!(
                    "the PMIx fence did not complete within {} ms (a rank of the job never started \
                     a communicator?)",
                    deadline.as_millis()
                )),
            }
        })
        .clone()
}

/// Rank 0's rendezvous that the PMIx exchange bound, for its communicator (once).
pub(crate) fn take_root() -> Option<Root> {
    ROOT.lock().ok()?.take()
}

/// The address rank 0 serves the rendezvous on: the interface `R2CCL_OOB_IFACE` names, else the
/// first IPv4 interface that is neither loopback nor a container bridge (as NCCL picks its socket
/// interface), else loopback.
fn root_ip() -> IpAddr {
    let addresses = crate::netif::ipv4_addresses();
    if let Some(spec) = std::env::var("R2CCL_OOB_IFACE").ok().filter(|s| !s.is_empty()) {
        if let Some((_, ip)) = crate::netif::select_oob(&spec, &addresses) {
            return IpAddr::V4(ip);
        }
    }
    addresses
        .into_iter()
        .find(|(name, ip)| !ip.is_loopback() && !name.starts_with("docker") && !name.starts_with("virbr"))
        .map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), |(_, ip)| IpAddr::V4(ip))
}

/// Look `name` up in `lib`.
///
/// # Safety
/// `F` must be the symbol's C signature.
unsafe fn symbol<F: Copy>(lib: *mut c_void, name: &CStr) -> Result<F, String> {
    // SAFETY: `lib` is a live handle from dlopen; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("libpmix.so.2 has no {}", name.to_string_lossy()));
    }
    // SAFETY: the caller names the symbol's signature; a function pointer has a pointer's size.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

/// Init, (rank 0) create and put, fence, get rank 0's id, fence, finalize.
fn exchange() -> Result<(UniqueId, Option<Root>), String> {
    // SAFETY: dlopen of a library by its soname; the handle is never closed (PMIx keeps threads).
    let lib = unsafe { libc::dlopen(c"libpmix.so.2".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if lib.is_null() {
        return Err("PMIX_NAMESPACE is set but libpmix.so.2 cannot be loaded (install libpmix2)".into());
    }
    // SAFETY: the signatures are those of pmix.h (v2 and later).
    let (init, put, commit, fence, get, finalize) = unsafe {
        (
            symbol::<InitFn>(lib, c"PMIx_Init")?,
            symbol::<PutFn>(lib, c"PMIx_Put")?,
            symbol::<CommitFn>(lib, c"PMIx_Commit")?,
            symbol::<FenceFn>(lib, c"PMIx_Fence")?,
            symbol::<GetFn>(lib, c"PMIx_Get")?,
            symbol::<FinalizeFn>(lib, c"PMIx_Finalize")?,
        )
    };
    let mut me = PmixProc { nspace: [0; NSLEN], rank: 0 };
    // SAFETY: `me` is a writable pmix_proc_t; no info array.
    let rc = unsafe { init(&mut me, std::ptr::null(), 0) };
    if rc != 0 {
        return Err(format!("PMIx_Init failed with status {rc}"));
    }
    let key = CString::new(KEY).map_err(|e| e.to_string())?;
    let result = (|| {
        let mut root = None;
        if me.rank == 0 {
            let r = Root::create(root_ip()).map_err(|e| format!("binding the rendezvous: {e}"))?;
            let id = r.unique_id().map_err(|e| e.to_string())?.to_string();
            let text = CString::new(id).map_err(|e| e.to_string())?;
            let mut value = PmixValue {
                kind: PMIX_STRING,
                data: [text.as_ptr().cast_mut().cast(), std::ptr::null_mut(), std::ptr::null_mut()],
            };
            // SAFETY: PMIx_Put copies the value; `text` outlives the call.
            let rc = unsafe { put(PMIX_GLOBAL, key.as_ptr(), &mut value) };
            if rc != 0 {
                return Err(format!("PMIx_Put failed with status {rc}"));
            }
            // SAFETY: no arguments.
            let rc = unsafe { commit() };
            if rc != 0 {
                return Err(format!("PMIx_Commit failed with status {rc}"));
            }
            root = Some(r);
        }
        // SAFETY: no procs (every process of our namespace) and no info.
        let rc = unsafe { fence(std::ptr::null(), 0, std::ptr::null(), 0) };
        if rc != 0 {
            return Err(format!("PMIx_Fence failed with status {rc}"));
        }
        let zero = PmixProc { nspace: me.nspace, rank: 0 };
        let mut out: *mut PmixValue = std::ptr::null_mut();
        // SAFETY: `zero` names rank 0 of our namespace; PMIx allocates `out`.
        let rc = unsafe { get(&zero, key.as_ptr(), std::ptr::null(), 0, &mut out) };
        if rc != 0 || out.is_null() {
            return Err(format!("PMIx_Get of rank 0's {KEY} failed with status {rc}"));
        }
        // SAFETY: a successful Get returns a value PMIx allocated; a string value's first data
        // word is its char pointer. The value is left to PMIx's allocator (a few bytes, once).
        let text = unsafe {
            let v = &*out;
            if v.kind != PMIX_STRING || v.data[0].is_null() {
                return Err(format!("rank 0's {KEY} is not a string (type {})", v.kind));
            }
            CStr::from_ptr(v.data[0].cast::<c_char>()).to_string_lossy().into_owned()
        };
        let id = text.parse::<UniqueId>().map_err(|e| format!("rank 0's {KEY}: {e}"))?;
        // Every rank has read it before rank 0 may leave the job's store behind.
        // SAFETY: as above.
        let rc = unsafe { fence(std::ptr::null(), 0, std::ptr::null(), 0) };
        if rc != 0 {
            return Err(format!("the second PMIx_Fence failed with status {rc}"));
        }
        Ok((id, root))
    })();
    // SAFETY: balanced with the successful PMIx_Init above (PMIx counts them).
    let _ = unsafe { finalize(std::ptr::null(), 0) };
    result
}
