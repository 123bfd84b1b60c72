//! Reading from and writing to a proxy's client during its handshake: a
//! deadline for the whole handshake, then an idle timeout per read.

use std::io::{self, BufReader, Read, Write};
use std::time::{Duration, Instant};

use crate::relay::Sock;

/// Reads from the client with a deadline for the whole handshake, or (once
/// the handshake is over) an idle timeout per read.
pub(super) struct ClientReader<'a> {
    pub(super) stream: &'a Sock,
    pub(super) deadline: Option<Instant>,
    pub(super) idle: Duration,
    pub(super) set: Option<Duration>,
    /// Bytes already read from the client (by the first read, which
    /// looks for a handover), served before the socket's.
    pub(super) prefix: Vec<u8>,
}

impl Read for ClientReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.prefix.is_empty() {
            let n = buf.len().min(self.prefix.len());
            buf[..n].copy_from_slice(&self.prefix[..n]);
            self.prefix.drain(..n);
            return Ok(n);
        }
        let timeout = match self.deadline {
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "handshake timed out",
                    ));
                }
                left
            }
            None => self.idle,
        };
        if self.set != Some(timeout) {
            self.stream.set_read_timeout(Some(timeout))?;
            self.set = Some(timeout);
        }
        match (&mut &*self.stream).read(buf) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "client read timed out",
                ))
            }
            other => other,
        }
    }
}

/// The client, buffered: a request head is read in one or two reads.
pub(super) type Client<'a> = BufReader<ClientReader<'a>>;

/// Reads through the buffered client reader, writes to the client socket.
pub(super) struct Duplex<'r, 'a, 'w> {
    pub(super) r: &'r mut Client<'a>,
    pub(super) w: &'w Sock,
}

impl Read for Duplex<'_, '_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.r.read(buf)
    }
}

impl Write for Duplex<'_, '_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&mut &*self.w).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Whether a read or write failed because its time ran out.
pub(super) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::net::UnixStream;

    fn reader<'a>(stream: &'a Sock, deadline: Option<Instant>, prefix: &[u8]) -> ClientReader<'a> {
        ClientReader {
            stream,
            deadline,
            idle: Duration::from_millis(50),
            set: None,
            prefix: prefix.to_vec(),
        }
    }

    #[test]
    fn bytes_read_before_the_handshake_come_first() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let sock = Sock::Unix(ours);
        theirs.write_all(b" world").unwrap();
        drop(theirs);
        let mut r = reader(&sock, None, b"hello");
        let mut got = String::new();
        r.read_to_string(&mut got).unwrap();
        assert_eq!(got, "hello world");
    }

    #[test]
    fn a_handshake_past_its_deadline_times_out_without_reading() {
        let (ours, mut theirs) = UnixStream::pair().unwrap();
        let sock = Sock::Unix(ours);
        theirs.write_all(b"late").unwrap();
        let past = Instant::now().checked_sub(Duration::from_millis(1));
        let mut r = reader(&sock, past, b"");
        let e = r.read(&mut [0u8; 8]).unwrap_err();
        assert!(is_timeout(&e), "{e}");
    }

    #[test]
    fn a_silent_client_times_out_after_the_idle_timeout() {
        let (ours, _theirs) = UnixStream::pair().unwrap();
        let sock = Sock::Unix(ours);
        let mut r = reader(&sock, None, b"");
        let e = r.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
