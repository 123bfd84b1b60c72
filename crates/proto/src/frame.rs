//! Framing: a 4-byte big-endian length and that many bytes, JSON for a
//! control message or a tagged binary chunk of output or input. Frames are
//! bounded by [`MAX_FRAME`]: a larger length is refused before anything is
//! read into memory.

use std::io::{self, Read, Write};

use serde::{de::DeserializeOwned, Serialize};

/// The largest frame either side accepts: 16 MiB.
pub const MAX_FRAME: u32 = 16 << 20;

/// Which output stream a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamId {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// One decoded frame. A frame's payload is JSON when its first byte is `{`;
/// otherwise the first byte tags a binary frame:
///
/// - `1` output: command id (u64), stream (`1` stdout, `2` stderr), offset
///   of the chunk in the stream (u64), bytes;
/// - `2` stdin: command id (u64), bytes.
///
/// Integers are big-endian. Output offsets number the bytes of each stream,
/// so a reader can tell a gap or a repeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame<T> {
    /// A control message.
    Message(T),
    /// Output of a command (guest to hako).
    Output {
        /// The command.
        id: u64,
        /// Which stream.
        stream: StreamId,
        /// Offset of `data` in the stream.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// Input for a command (hako to guest).
    Stdin {
        /// The command.
        id: u64,
        /// The bytes.
        data: Vec<u8>,
    },
}

const TAG_OUTPUT: u8 = 1;
const TAG_STDIN: u8 = 2;
/// The largest chunk of data one frame carries.
pub const MAX_CHUNK: usize = 64 * 1024;

/// Encodes a frame: length prefix and payload.
pub fn encode<T: Serialize>(frame: &Frame<T>) -> io::Result<Vec<u8>> {
    let mut out = vec![0u8; 4];
    match frame {
        Frame::Message(msg) => serde_json::to_writer(&mut out, msg).map_err(io::Error::other)?,
        Frame::Output {
            id,
            stream,
            offset,
            data,
        } => {
            out.push(TAG_OUTPUT);
            out.extend_from_slice(&id.to_be_bytes());
            out.push(match stream {
                StreamId::Stdout => 1,
                StreamId::Stderr => 2,
            });
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(data);
        }
        Frame::Stdin { id, data } => {
            out.push(TAG_STDIN);
            out.extend_from_slice(&id.to_be_bytes());
            out.extend_from_slice(data);
        }
    }
    let len = u32::try_from(out.len() - 4)
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    out[..4].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

pub(crate) fn invalid(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

fn be_u64(bytes: &[u8]) -> io::Result<u64> {
    bytes
        .get(..8)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| invalid("binary frame too short"))
}

/// Decodes a frame's payload (without its length prefix).
pub fn decode<T: DeserializeOwned>(payload: &[u8]) -> io::Result<Frame<T>> {
    match payload.first() {
        Some(b'{') => serde_json::from_slice(payload)
            .map(Frame::Message)
            .map_err(|e| invalid(format!("malformed message: {e}"))),
        Some(&TAG_OUTPUT) => {
            let id = be_u64(&payload[1..])?;
            let stream = match payload.get(9) {
                Some(1) => StreamId::Stdout,
                Some(2) => StreamId::Stderr,
                other => return Err(invalid(format!("unknown output stream {other:?}"))),
            };
            let offset = be_u64(&payload[10..])?;
            Ok(Frame::Output {
                id,
                stream,
                offset,
                data: payload[18..].to_vec(),
            })
        }
        Some(&TAG_STDIN) => Ok(Frame::Stdin {
            id: be_u64(&payload[1..])?,
            data: payload[9..].to_vec(),
        }),
        Some(tag) => Err(invalid(format!("unknown frame tag {tag}"))),
        None => Err(invalid("empty frame")),
    }
}

/// Writes one control message as a frame.
pub fn write_frame<T: Serialize>(mut w: impl Write, msg: &T) -> io::Result<()> {
    w.write_all(&encode(&Frame::Message(msg))?)?;
    w.flush()
}

/// Reads one frame's payload, refusing a length over [`MAX_FRAME`] before
/// reading it.
pub fn read_payload(mut r: impl Read) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_be_bytes(len);
    if len > MAX_FRAME {
        return Err(invalid(format!(
            "frame of {len} bytes is over the {MAX_FRAME}-byte limit"
        )));
    }
    let mut body = Vec::new();
    r.take(u64::from(len)).read_to_end(&mut body)?;
    if body.len() != len as usize {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "truncated frame",
        ));
    }
    Ok(body)
}

/// Reads one frame.
pub fn read_any<T: DeserializeOwned>(r: impl Read) -> io::Result<Frame<T>> {
    decode(&read_payload(r)?)
}

/// Reads one frame that must be a control message.
pub fn read_frame<T: DeserializeOwned>(r: impl Read) -> io::Result<T> {
    match read_any(r)? {
        Frame::Message(msg) => Ok(msg),
        _ => Err(invalid("expected a control message, got a data frame")),
    }
}

/// What [`Decoder::next_frame`] found in the bytes received so far.
#[derive(Debug)]
pub enum Decoded<T> {
    /// A whole frame.
    Frame(Frame<T>),
    /// A whole frame that could not be decoded; the stream goes on.
    Bad(String),
    /// More bytes are needed.
    Incomplete,
}

/// Splits a byte stream into frames as bytes arrive, for a reader that must
/// not block. A frame over [`MAX_FRAME`] is reported once and its bytes are
/// skipped as they come, so the stream stays in step.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    skip: u64,
}

impl Decoder {
    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        let skipped = usize::try_from(self.skip)
            .unwrap_or(usize::MAX)
            .min(bytes.len());
        self.skip -= skipped as u64;
        self.buf.extend_from_slice(&bytes[skipped..]);
    }

    /// Whether a frame was begun and not finished.
    pub fn mid_frame(&self) -> bool {
        !self.buf.is_empty() || self.skip > 0
    }

    /// The next frame, if the bytes so far hold one.
    pub fn next_frame<T: DeserializeOwned>(&mut self) -> Decoded<T> {
        let Some(len) = self.buf.get(..4) else {
            return Decoded::Incomplete;
        };
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        if len > MAX_FRAME {
            let have = (self.buf.len() - 4) as u64;
            self.skip = u64::from(len).saturating_sub(have);
            self.buf.drain(..(4 + (have.min(u64::from(len)) as usize)));
            return Decoded::Bad(format!(
                "frame of {len} bytes is over the {MAX_FRAME}-byte limit; skipped"
            ));
        }
        let end = 4 + len as usize;
        if self.buf.len() < end {
            return Decoded::Incomplete;
        }
        let result = decode(&self.buf[4..end]);
        self.buf.drain(..end);
        match result {
            Ok(frame) => Decoded::Frame(frame),
            Err(err) => Decoded::Bad(err.to_string()),
        }
    }
}

#[cfg(test)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::*;
    use hako_core::ExitStatus;

    fn exec() -> ToGuest {
        ToGuest::Exec(ExecRequest {
            id: 7,
            argv: vec!["echo".into(), "hi".into()],
            env: vec![("PATH".into(), "/bin".into())],
            cwd: Cwd::Path("/w".into()),
            timeout_ms: Some(5),
            stdin: false,
            max_output: 10,
            pty: None,
        })
    }

    #[test]
    fn frames_round_trip() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &exec()).unwrap();
        assert_eq!(read_frame::<ToGuest>(&buf[..]).unwrap(), exec());
        let output = Frame::<FromGuest>::Output {
            id: 3,
            stream: StreamId::Stderr,
            offset: 1 << 40,
            data: b"{not json".to_vec(),
        };
        let bytes = encode(&output).unwrap();
        assert_eq!(read_any::<FromGuest>(&bytes[..]).unwrap(), output);
        let stdin = Frame::<ToGuest>::Stdin {
            id: 9,
            data: vec![0, 1, 2],
        };
        let bytes = encode(&stdin).unwrap();
        assert_eq!(read_any::<ToGuest>(&bytes[..]).unwrap(), stdin);
    }

    /// A control frame is told from a binary one by its first byte `{`:
    /// every message must serialise as a JSON object (a unit variant would
    /// be a bare string, which the decoder takes for an unknown tag).
    #[test]
    fn every_control_message_is_a_json_object_and_round_trips() {
        let from = [
            FromGuest::Ready { version: VERSION },
            FromGuest::Refused {
                message: "m".into(),
                errno: Some(11),
            },
            FromGuest::Exited {
                id: 1,
                status: ExitStatus::Code(0),
                timed_out: false,
                oom_killed: false,
                stdout_total: 0,
                stderr_total: 0,
            },
            FromGuest::SpawnFailed {
                id: 1,
                kind: SpawnFailure::NotFound,
                errno: None,
                message: "m".into(),
            },
            FromGuest::SessionOpened { id: 1 },
            FromGuest::SessionEnded {
                id: 1,
                message: "m".into(),
            },
            FromGuest::Bye {},
            FromGuest::Failed {
                id: None,
                message: "m".into(),
                errno: None,
            },
        ];
        for msg in from {
            let bytes = encode(&Frame::Message(&msg)).unwrap();
            assert_eq!(bytes[4], b'{', "{msg:?}");
            assert_eq!(
                read_any::<FromGuest>(&bytes[..]).unwrap(),
                Frame::Message(msg)
            );
        }
        let to = [
            ToGuest::Hello(Box::new(Hello {
                version: VERSION,
                linux: None,
                network: None,
                seal: None,
                memory: None,
                confine: None,
            })),
            exec(),
            ToGuest::CloseStdin { id: 1 },
            ToGuest::Kill { id: 1 },
            ToGuest::Resize {
                id: 1,
                rows: 2,
                cols: 3,
            },
            ToGuest::OpenSession(SessionRequest {
                id: 1,
                shell: None,
                env: vec![],
                cwd: Cwd::Fd,
            }),
            ToGuest::SessionExec(SessionExecRequest {
                id: 2,
                session: 1,
                script: "x".into(),
                timeout_ms: None,
                max_output: 1,
            }),
            ToGuest::CloseSession { id: 1 },
        ];
        for msg in to {
            let bytes = encode(&Frame::Message(&msg)).unwrap();
            assert_eq!(bytes[4], b'{', "{msg:?}");
            assert_eq!(
                read_any::<ToGuest>(&bytes[..]).unwrap(),
                Frame::Message(msg)
            );
        }
    }

    #[test]
    fn oversized_frame_is_refused_without_reading_it() {
        let mut buf = (MAX_FRAME + 1).to_be_bytes().to_vec();
        buf.extend_from_slice(b"{}");
        let err = read_frame::<ToGuest>(&buf[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn truncated_and_malformed_frames_are_errors() {
        let mut buf = 100u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"{\"version\"");
        assert!(read_frame::<ToGuest>(&buf[..]).is_err());
        let mut buf = 3u32.to_be_bytes().to_vec();
        buf.extend_from_slice(b"{x}");
        assert!(read_frame::<ToGuest>(&buf[..]).is_err());
        for payload in [&[1u8, 0, 0][..], &[2, 0], &[9, 9], &[]] {
            assert!(decode::<ToGuest>(payload).is_err(), "{payload:?}");
        }
    }

    /// Arbitrary bytes, and valid frames with bytes flipped, cut or
    /// inserted, fed in random pieces: the decoder never panics, never
    /// holds more than one frame's bytes, and a valid frame after a reset
    /// still decodes.
    #[test]
    fn the_decoder_survives_arbitrary_input() {
        let budget: u64 = std::env::var("HAKO_FUZZ_ITERATIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let valid: Vec<Vec<u8>> = vec![
            encode(&Frame::Message(exec())).unwrap(),
            encode(&Frame::<FromGuest>::Output {
                id: 1,
                stream: StreamId::Stdout,
                offset: 3,
                data: b"abc".to_vec(),
            })
            .unwrap(),
            encode(&Frame::<ToGuest>::Stdin {
                id: 2,
                data: vec![0; 40],
            })
            .unwrap(),
            encode(&Frame::Message(FromGuest::Exited {
                id: 1,
                status: ExitStatus::Signal(9),
                timed_out: true,
                oom_killed: false,
                stdout_total: 5,
                stderr_total: 0,
            }))
            .unwrap(),
        ];
        for _ in 0..budget {
            let mut bytes = match next() % 3 {
                0 => (0..next() % 64).map(|_| next() as u8).collect::<Vec<u8>>(),
                _ => valid[next() as usize % valid.len()].clone(),
            };
            for _ in 0..(next() % 4) {
                if bytes.is_empty() {
                    break;
                }
                let at = next() as usize % bytes.len();
                match next() % 3 {
                    0 => bytes[at] ^= 1 << (next() % 8),
                    1 => bytes.truncate(at),
                    _ => bytes.insert(at, next() as u8),
                }
            }
            let _ = decode::<ToGuest>(&bytes);
            let _ = decode::<FromGuest>(&bytes);
            let mut decoder = Decoder::default();
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let n = 1 + next() as usize % rest.len();
                decoder.push(&rest[..n]);
                rest = &rest[n..];
                while let Decoded::Frame(_) | Decoded::Bad(_) = decoder.next_frame::<ToGuest>() {}
                assert!(decoder.buf.len() <= 4 + MAX_FRAME as usize);
            }
        }
    }

    #[test]
    fn decoder_reports_bad_frames_and_stays_in_step() {
        let good = encode(&Frame::Message(exec())).unwrap();
        let mut stream = Vec::new();
        // Malformed JSON, then an oversized frame (length only, body sent
        // in pieces), then a good frame: the decoder reports two problems
        // and still finds the good frame.
        stream.extend_from_slice(&3u32.to_be_bytes());
        stream.extend_from_slice(b"{x}");
        let big = MAX_FRAME + 10;
        stream.extend_from_slice(&big.to_be_bytes());
        let mut decoder = Decoder::default();
        decoder.push(&stream);
        assert!(matches!(decoder.next_frame::<ToGuest>(), Decoded::Bad(_)));
        assert!(matches!(decoder.next_frame::<ToGuest>(), Decoded::Bad(m) if m.contains("limit")));
        let body = vec![b'x'; big as usize];
        for piece in body.chunks(1 << 20) {
            decoder.push(piece);
            assert!(matches!(
                decoder.next_frame::<ToGuest>(),
                Decoded::Incomplete
            ));
        }
        assert!(!decoder.mid_frame());
        // A good frame split byte by byte.
        for (i, b) in good.iter().enumerate() {
            decoder.push(&[*b]);
            let next = decoder.next_frame::<ToGuest>();
            if i + 1 < good.len() {
                assert!(matches!(next, Decoded::Incomplete));
            } else {
                assert!(matches!(next, Decoded::Frame(Frame::Message(m)) if m == exec()));
            }
        }
    }
}
