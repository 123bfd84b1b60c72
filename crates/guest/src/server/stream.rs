//! Bytes between the guest and a command's pipes: output forwarded as
//! frames up to the command's cap, and input written as the command reads
//! it, never blocking the guest. For commands and sessions alike.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use hako_sys::rustix::io::Errno;

use crate::proto::{Frame, FromGuest, StreamId};

/// Writes what is queued into `fd` without blocking; a closed reader (the
/// program stopped reading its input) closes our end and drops the rest,
/// which is not an error.
pub(super) fn feed(fd: &mut Option<OwnedFd>, pending: &mut VecDeque<u8>) {
    while let Some(out) = fd {
        let (head, _) = pending.as_slices();
        if head.is_empty() {
            break;
        }
        match hako_sys::rustix::io::write(&*out, head) {
            Ok(n) => {
                pending.drain(..n);
            }
            Err(Errno::AGAIN) => break,
            Err(Errno::INTR) => {}
            Err(_) => {
                *fd = None;
                pending.clear();
            }
        }
    }
}

/// The frame forwarding the part of `data` (bytes of stream `s` of command
/// `id`, starting at `offset`) under the cap `max`; `None` when all of it
/// is over.
pub(super) fn capped(
    id: u64,
    s: usize,
    offset: u64,
    data: &[u8],
    max: u64,
) -> Option<Frame<FromGuest>> {
    let room = max.saturating_sub(offset);
    let keep = data.len().min(usize::try_from(room).unwrap_or(usize::MAX));
    (keep > 0).then(|| Frame::Output {
        id,
        stream: if s == 0 {
            StreamId::Stdout
        } else {
            StreamId::Stderr
        },
        offset,
        data: data[..keep].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::pipe;

    fn output(frame: Option<Frame<FromGuest>>) -> Option<(u64, StreamId, u64, Vec<u8>)> {
        match frame? {
            Frame::Output {
                id,
                stream,
                offset,
                data,
            } => Some((id, stream, offset, data)),
            _ => panic!("not an output frame"),
        }
    }

    #[test]
    fn output_under_the_cap_is_forwarded_whole() {
        let got = output(capped(7, 0, 0, b"hello", 100));
        assert_eq!(got, Some((7, StreamId::Stdout, 0, b"hello".to_vec())));
    }

    #[test]
    fn output_that_crosses_the_cap_is_cut_at_it() {
        let got = output(capped(7, 1, 8, b"0123456789", 10));
        assert_eq!(got, Some((7, StreamId::Stderr, 8, b"01".to_vec())));
    }

    #[test]
    fn output_past_the_cap_sends_nothing() {
        assert!(capped(7, 0, 10, b"more", 10).is_none());
        assert!(capped(7, 0, 11, b"more", 10).is_none());
        assert!(capped(7, 0, 0, b"", 10).is_none(), "nothing to send");
        assert!(capped(7, 0, 0, b"any", 0).is_none(), "a cap of nothing");
    }

    #[test]
    fn the_cap_never_overflows_at_the_top_of_the_range() {
        let got = output(capped(1, 0, u64::MAX - 1, b"abc", u64::MAX));
        assert_eq!(got.map(|o| o.3), Some(b"a".to_vec()));
    }

    #[test]
    fn feeding_a_reader_that_is_gone_drops_the_rest_quietly() {
        let (r, w) = pipe().unwrap();
        drop(r);
        let mut fd = Some(w);
        let mut pending: VecDeque<u8> = b"nobody reads".iter().copied().collect();
        feed(&mut fd, &mut pending);
        assert!(fd.is_none() && pending.is_empty());
    }

    #[test]
    fn feeding_a_full_pipe_keeps_the_rest_queued() {
        let (_r, w) = pipe().unwrap();
        let _ = hako_sys::rustix::io::ioctl_fionbio(&w, true);
        let mut fd = Some(w);
        let mut pending: VecDeque<u8> = std::iter::repeat_n(b'x', 1 << 20).collect();
        feed(&mut fd, &mut pending);
        assert!(fd.is_some(), "a full pipe is not a closed one");
        assert!(!pending.is_empty() && pending.len() < 1 << 20);
    }
}
