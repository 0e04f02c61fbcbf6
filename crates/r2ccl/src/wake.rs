//! Wake-ups for the progress thread: a non-blocking socket pair that the caller's threads write
//! a byte to, so an idle progress thread can sleep in `poll(2)` (with the UCX workers' event fds
//! and the OOB connections) and still react at once to a new request.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// The writing end; cheap to clone, callable from any thread.
#[derive(Clone, Debug)]
pub struct Waker(Arc<UnixStream>);

/// The reading end, owned by the progress thread.
#[derive(Debug)]
pub struct WakeReceiver(UnixStream);

/// A connected pair, or the OS error that prevented it.
pub fn pair() -> std::io::Result<(Waker, WakeReceiver)> {
    let (w, r) = UnixStream::pair()?;
    w.set_nonblocking(true)?;
    r.set_nonblocking(true)?;
    Ok((Waker(Arc::new(w)), WakeReceiver(r)))
}

impl Waker {
    /// Wake the progress thread (never blocks; a full socket means a wake-up is pending anyway).
    pub fn wake(&self) {
        let _ = (&*self.0).write(&[1]);
    }
}

impl WakeReceiver {
    /// The descriptor to `poll(2)` for readability.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Consume pending wake-ups (never blocks).
    pub fn drain(&mut self) {
        let mut buf = [0u8; 256];
        while matches!(self.0.read(&mut buf), Ok(n) if n > 0) {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_makes_the_fd_readable_and_drain_clears_it() {
        let (w, mut r) = pair().expect("socket pair");
        let readable = |fd: RawFd| {
            let mut p = [libc_pollfd(fd)];
            // SAFETY: one valid pollfd, zero timeout.
            unsafe { poll(p.as_mut_ptr(), 1, 0) > 0 }
        };
        assert!(!readable(r.fd()));
        for _ in 0..1000 {
            w.wake();
        }
        assert!(readable(r.fd()));
        r.drain();
        assert!(!readable(r.fd()));
    }

    #[repr(C)]
    struct PollFd {
        fd: i32,
        events: i16,
        revents: i16,
    }
    fn libc_pollfd(fd: RawFd) -> PollFd {
        PollFd { fd, events: 1, revents: 0 }
    }
    extern "C" {
        fn poll(fds: *mut PollFd, n: u64, timeout: i32) -> i32;
    }
}
