//! Bootstrap framing: length-prefixed frames and checked field readers that never panic.

use std::io::{self, Read, Write};

/// Largest frame accepted (a table for many thousands of ranks fits).
pub(crate) const MAX_FRAME: usize = 16 << 20;

/// Why bytes from a peer were not a valid message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The frame announced more bytes than allowed.
    #[error("frame of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// The message ended before a field did.
    #[error("message truncated at byte {0}")]
    Truncated(usize),
    /// A string field is not UTF-8.
    #[error("string field is not UTF-8")]
    Utf8,
    /// Bytes left over after the last field.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len =
        u32::try_from(payload.len()).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)?;
    w.flush()
}

/// Read one frame; the IO error kind tells timeouts from closed connections.
pub(crate) fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    read_frame_max(r, MAX_FRAME)
}

/// Read one frame of at most `max` bytes (a stranger's before it authenticates: kilobytes).
pub(crate) fn read_frame_max(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, WireError::TooLarge(len)));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    Ok(buf)
}

/// A socket whose reads and writes all end by one deadline: each sets the socket timeout to
/// the time left, so a peer that sends a byte now and then cannot stretch a handshake.
pub(crate) struct Deadlined<'a> {
    pub(crate) stream: &'a std::net::TcpStream,
    pub(crate) deadline: std::time::Instant,
}

impl Deadlined<'_> {
    fn left(&self) -> io::Result<std::time::Duration> {
        self.deadline
            .checked_duration_since(std::time::Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "handshake deadline passed"))
    }
}

impl Read for Deadlined<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        (&mut &*self.stream).read(buf)
    }
}

impl Write for Deadlined<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        (&mut &*self.stream).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&mut &*self.stream).flush()
    }
}

/// Appends fields to a message.
#[derive(Default)]
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub(crate) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Length-prefixed bytes.
    pub(crate) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32).raw(v)
    }
}

/// Reads fields from a message; every read is bounds-checked.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }
    pub(crate) fn raw(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or(WireError::Truncated(self.pos))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        Ok(self.raw(1)?[0])
    }
    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.raw(4)?);
        Ok(u32::from_le_bytes(b))
    }
    pub(crate) fn array16(&mut self) -> Result<[u8; 16], WireError> {
        let mut b = [0u8; 16];
        b.copy_from_slice(self.raw(16)?);
        Ok(b)
    }
    pub(crate) fn bytes(&mut self) -> Result<&'a [u8], WireError> {
        let n = self.u32()? as usize;
        self.raw(n)
    }
    pub(crate) fn string(&mut self) -> Result<String, WireError> {
        std::str::from_utf8(self.bytes()?).map(str::to_owned).map_err(|_| WireError::Utf8)
    }
    pub(crate) fn finish(&self) -> Result<(), WireError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(WireError::Trailing(n)),
        }
    }
}
