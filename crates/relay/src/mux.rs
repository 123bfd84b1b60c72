//! Many connections over one byte stream: how a `vm` sandbox's egress
//! reaches the proxy. The VM has no NIC and no socket the host can hand a
//! descriptor across, only virtio-serial ports: inside, a bridge accepts
//! the forwarder's connections on a unix socket and carries each as a
//! stream of this multiplexer over one port; outside, hako's bridge opens a
//! connection to the proxy's socket for each stream. The bytes are the
//! forwarder's and the proxy's as ever (the proxy's policy applies
//! unchanged); the multiplexer only carries them.
//!
//! A frame is a stream id (`u32`), a kind (`u8`: [`OPEN`], [`DATA`],
//! [`CLOSE`], [`RESET`]) and a length (`u32`, at most [`MAX_PAYLOAD`]), big-endian,
//! then the payload. Only the inside opens streams. Each side bounds what
//! it holds: at most [`MAX_STREAMS`] streams, and for each a queue of
//! [`QUEUE`] frames towards its socket (64 MiB at most in all); a stream
//! whose socket does not keep up is closed rather than let stall the
//! others.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// A stream opened (inside to outside).
pub const OPEN: u8 = 0;
/// Bytes of a stream.
pub const DATA: u8 = 1;
/// The end of one direction of a stream: the sender's socket has no more
/// to say (the receiver shuts its socket's writing side, and may still
/// send the other way).
pub const CLOSE: u8 = 2;
/// A stream ended both ways at once (its socket failed, or did not keep
/// up).
pub const RESET: u8 = 3;
/// The most bytes one frame carries.
pub const MAX_PAYLOAD: usize = 64 << 10;
/// The most streams open at once.
pub const MAX_STREAMS: usize = 128;
/// Frames queued towards one stream's socket before the stream is closed.
pub const QUEUE: usize = 8;

const HEADER: usize = 9;

/// Encodes one frame.
pub fn frame(stream: u32, kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(&stream.to_be_bytes());
    out.push(kind);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// Reads one frame; `Ok(None)` at a clean end of the stream. A frame too
/// long or of an unknown kind is an error (the other side is not trusted).
pub fn read_frame(input: &mut impl Read) -> io::Result<Option<(u32, u8, Vec<u8>)>> {
    let mut header = [0u8; HEADER];
    let mut got = 0;
    while got < HEADER {
        match input.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let stream = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let kind = header[4];
    let len = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) as usize;
    if len > MAX_PAYLOAD || kind > RESET {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a multiplexer frame of kind {kind} and {len} bytes"),
        ));
    }
    let mut payload = vec![0u8; len];
    input.read_exact(&mut payload)?;
    Ok(Some((stream, kind, payload)))
}

/// A stream as one side holds it: the queue towards its socket, and the
/// socket itself (to reset it).
struct Entry {
    tx: SyncSender<Vec<u8>>,
    socket: UnixStream,
}

/// One side of the multiplexer.
#[derive(Clone)]
pub struct Mux {
    out: Arc<Mutex<Box<dyn Write + Send>>>,
    streams: Arc<Mutex<HashMap<u32, Entry>>>,
    next: Arc<Mutex<u32>>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").finish_non_exhaustive()
    }
}

impl Mux {
    /// A side writing its frames to `out`.
    pub fn new(out: Box<dyn Write + Send>) -> Mux {
        Mux {
            out: Arc::new(Mutex::new(out)),
            streams: Arc::new(Mutex::new(HashMap::new())),
            next: Arc::new(Mutex::new(1)),
        }
    }

    fn send(&self, stream: u32, kind: u8, payload: &[u8]) -> io::Result<()> {
        let bytes = frame(stream, kind, payload);
        let mut out = self
            .out
            .lock()
            .map_err(|_| io::Error::other("the multiplexer's lock is poisoned"))?;
        out.write_all(&bytes)?;
        out.flush()
    }

    /// Carries `socket` as a new stream (the inside's side): announces it
    /// with the bytes already read from it (`first`), and relays both ways
    /// until both ends have closed.
    pub fn open(&self, socket: UnixStream, first: &[u8]) -> io::Result<()> {
        let stream = {
            let mut next = self
                .next
                .lock()
                .map_err(|_| io::Error::other("the multiplexer's lock is poisoned"))?;
            let id = *next;
            *next = next.wrapping_add(1).max(1);
            id
        };
        let rx = self.register(stream, &socket)?;
        let announced = self.send(stream, OPEN, &[]).and_then(|()| {
            first
                .chunks(MAX_PAYLOAD)
                .try_for_each(|chunk| self.send(stream, DATA, chunk))
        });
        match announced.and_then(|()| self.start(stream, socket, rx)) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.reset_here(stream);
                Err(e)
            }
        }
    }

    /// Registers `socket` as `stream` and starts its two relaying threads.
    fn attach(&self, stream: u32, socket: UnixStream) -> io::Result<()> {
        let rx = self.register(stream, &socket)?;
        self.start(stream, socket, rx)
            .inspect_err(|_| self.reset_here(stream))
    }

    /// Makes room for `stream`: its queue towards its socket.
    fn register(
        &self,
        stream: u32,
        socket: &UnixStream,
    ) -> io::Result<std::sync::mpsc::Receiver<Vec<u8>>> {
        let (tx, rx) = sync_channel::<Vec<u8>>(QUEUE);
        let socket = socket.try_clone()?;
        let mut streams = self
            .streams
            .lock()
            .map_err(|_| io::Error::other("the multiplexer's lock is poisoned"))?;
        if streams.len() >= MAX_STREAMS || streams.contains_key(&stream) {
            return Err(io::Error::other("too many streams at once, or one reused"));
        }
        streams.insert(stream, Entry { tx, socket });
        Ok(rx)
    }

    /// Starts the two threads that relay `stream` to and from `socket`.
    fn start(
        &self,
        stream: u32,
        socket: UnixStream,
        rx: std::sync::mpsc::Receiver<Vec<u8>>,
    ) -> io::Result<()> {
        let mut writer = socket.try_clone()?;
        std::thread::Builder::new()
            .name("hako-mux-write".into())
            .spawn(move || {
                // An empty frame: the other side has no more to say.
                for bytes in rx {
                    if bytes.is_empty() {
                        let _ = writer.shutdown(std::net::Shutdown::Write);
                        break;
                    }
                    if writer.write_all(&bytes).is_err() {
                        let _ = writer.shutdown(std::net::Shutdown::Both);
                        break;
                    }
                }
            })?;
        let mux = self.clone();
        let mut reader = socket;
        std::thread::Builder::new()
            .name("hako-mux-read".into())
            .spawn(move || {
                let mut buf = vec![0u8; MAX_PAYLOAD];
                let ended = loop {
                    match reader.read(&mut buf) {
                        Ok(0) => break CLOSE,
                        Err(_) => break RESET,
                        Ok(n) => {
                            if mux.send(stream, DATA, &buf[..n]).is_err() {
                                break RESET;
                            }
                        }
                    }
                };
                let _ = mux.send(stream, ended, &[]);
                if ended == RESET {
                    mux.reset_here(stream);
                }
            })?;
        Ok(())
    }

    /// Ends `stream` both ways on this side: forgotten, its socket shut.
    fn reset_here(&self, stream: u32) {
        let entry = self.streams.lock().ok().and_then(|mut s| s.remove(&stream));
        if let Some(entry) = entry {
            let _ = entry.socket.shutdown(std::net::Shutdown::Both);
        }
    }

    /// The other side has no more to say on `stream`: forgotten here (no
    /// more frames come for it), its socket's writing side shut once what
    /// is queued is written.
    fn finish(&self, stream: u32) {
        let entry = self.streams.lock().ok().and_then(|mut s| s.remove(&stream));
        if let Some(entry) = entry {
            if entry.tx.try_send(Vec::new()).is_err() {
                let _ = entry.socket.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    /// Reads frames from `input` until it ends, delivering each to its
    /// stream; an [`OPEN`] is answered by `connect` (the outside's side:
    /// a connection to the proxy), or refused where there is none.
    pub fn serve(
        &self,
        mut input: impl Read,
        connect: Option<&dyn Fn() -> io::Result<UnixStream>>,
    ) -> io::Result<()> {
        while let Some((stream, kind, payload)) = read_frame(&mut input)? {
            match kind {
                OPEN => {
                    let attached = match connect {
                        Some(connect) => connect().and_then(|s| self.attach(stream, s)),
                        None => Err(io::Error::other("this side opens no stream")),
                    };
                    if attached.is_err() {
                        self.send(stream, RESET, &[])?;
                    }
                }
                DATA => {
                    let tx = self
                        .streams
                        .lock()
                        .ok()
                        .and_then(|s| s.get(&stream).map(|e| e.tx.clone()));
                    let Some(tx) = tx else {
                        continue;
                    };
                    if payload.is_empty() {
                        continue;
                    }
                    match tx.try_send(payload) {
                        Ok(()) => {}
                        Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                            // Its socket does not keep up (or is gone):
                            // reset, not let stall every other stream.
                            self.reset_here(stream);
                            self.send(stream, RESET, &[])?;
                        }
                    }
                }
                CLOSE => self.finish(stream),
                _ => self.reset_here(stream),
            }
        }
        // The carrier is gone: so is every stream.
        let all: Vec<u32> = self
            .streams
            .lock()
            .map(|s| s.keys().copied().collect())
            .unwrap_or_default();
        for stream in all {
            self.reset_here(stream);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_frame_round_trips_and_a_bad_one_is_refused() {
        let bytes = frame(7, DATA, b"hello");
        let (stream, kind, payload) = read_frame(&mut &bytes[..]).unwrap().unwrap();
        assert_eq!((stream, kind, payload.as_slice()), (7, DATA, &b"hello"[..]));
        assert!(read_frame(&mut &[][..]).unwrap().is_none());
        let mut long = frame(1, DATA, &[]);
        long[5..9].copy_from_slice(&((MAX_PAYLOAD as u32) + 1).to_be_bytes());
        assert!(read_frame(&mut &long[..]).is_err());
        let unknown = frame(1, 9, &[]);
        assert!(read_frame(&mut &unknown[..]).is_err());
    }

    #[test]
    fn connections_cross_the_multiplexer_both_ways() {
        // The carrier: two socket pairs, one each way.
        let (in_to_out_w, in_to_out_r) = UnixStream::pair().unwrap();
        let (out_to_in_w, out_to_in_r) = UnixStream::pair().unwrap();
        let inside = Mux::new(Box::new(in_to_out_w));
        let outside = Mux::new(Box::new(out_to_in_w));
        // The outside's "proxy": an echo server on socket pairs.
        let connect = || -> io::Result<UnixStream> {
            let (ours, theirs) = UnixStream::pair()?;
            std::thread::spawn(move || {
                let mut theirs = theirs;
                let mut buf = [0u8; 1024];
                while let Ok(n) = theirs.read(&mut buf) {
                    if n == 0 || theirs.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            Ok(ours)
        };
        let out2 = outside.clone();
        std::thread::spawn(move || out2.serve(in_to_out_r, Some(&connect)));
        let in2 = inside.clone();
        std::thread::spawn(move || in2.serve(out_to_in_r, None));
        let mut clients = Vec::new();
        for i in 0..3 {
            let (mut client, carried) = UnixStream::pair().unwrap();
            inside.open(carried, b"").unwrap();
            client.write_all(format!("ping {i}").as_bytes()).unwrap();
            clients.push(client);
        }
        for (i, client) in clients.iter_mut().enumerate() {
            let want = format!("ping {i}");
            let mut got = vec![0u8; want.len()];
            client.read_exact(&mut got).unwrap();
            assert_eq!(got, want.as_bytes());
        }
        // A client that says all it has to say, then waits for the answer
        // (what `printf ... | nc` does): its end of writing crosses, and
        // the answer still comes back.
        let (mut client, carried) = UnixStream::pair().unwrap();
        inside.open(carried, b"half ").unwrap();
        client.write_all(b"closed").unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = String::new();
        client.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "half closed");
    }
}
