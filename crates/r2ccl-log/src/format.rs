//! The line format: a UTC timestamp, then NCCL's `host:pid:tid` prefix, the level, the
//! subsystem target and the message with its fields.
//!
//! `2026-12-06T14:50:47.123456Z gpu07:4121:4130  INFO r2ccl::net: failover ... rank=3`

use std::fmt;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter of [`crate::init`].
pub(crate) struct Prefixed {
    host: String,
    pid: u32,
}

impl Prefixed {
    pub(crate) fn new() -> Self {
        Self { host: crate::host_name(), pid: std::process::id() }
    }
}

/// The calling thread's id as the kernel knows it (what `top -H` and NCCL show).
fn tid() -> i64 {
    // SAFETY: gettid has no preconditions and cannot fail.
    i64::from(unsafe { libc::gettid() })
}

impl<S, N> FormatEvent<S, N> for Prefixed
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let meta = event.metadata();
        SystemTime.format_time(&mut w)?;
        write!(w, " {}:{}:{} {:>5} {}: ", self.host, self.pid, tid(), meta.level(), meta.target())?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}
