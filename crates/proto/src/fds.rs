//! Descriptors passed with frames over a unix socket (`SCM_RIGHTS`): the
//! `linux` backend hands the guest open directories and stdio this way.

use std::io::{self, Write};

use crate::frame::invalid;
use crate::MAX_FRAME;

/// The most descriptors one frame carries.
pub const MAX_FDS: usize = 8;

/// Sends `bytes` (whole frames) with `fds` attached to the first of them.
pub fn send_with_fds(
    stream: &std::os::unix::net::UnixStream,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> io::Result<()> {
    use hako_sys::rustix::net::{sendmsg, SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let mut space =
        [std::mem::MaybeUninit::<u8>::uninit(); hako_sys::rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut ancillary = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !ancillary.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one frame"));
    }
    // A stop and continue of the process can interrupt the call (gVisor
    // does): try again, the descriptors not yet sent.
    let sent = loop {
        match sendmsg(
            stream,
            &[io::IoSlice::new(bytes)],
            &mut ancillary,
            SendFlags::NOSIGNAL,
        ) {
            Err(hako_sys::rustix::io::Errno::INTR) => continue,
            other => break other?,
        }
    };
    let mut rest = stream;
    rest.write_all(&bytes[sent..])
}

/// Reads exactly one frame's payload and every descriptor that came with
/// it (close-on-exec), blocking; end of file before any byte is
/// `UnexpectedEof`.
pub fn recv_with_fds(
    stream: &std::os::unix::net::UnixStream,
) -> io::Result<(Vec<u8>, Vec<std::os::fd::OwnedFd>)> {
    use hako_sys::rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut fds = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut want = 4usize;
    while buf.len() < want {
        let mut space = [std::mem::MaybeUninit::<u8>::uninit();
            hako_sys::rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut ancillary = RecvAncillaryBuffer::new(&mut space);
        // Never read past this frame: what follows is not ours.
        let mut chunk = vec![0u8; want - buf.len()];
        let got = match recvmsg(
            stream,
            &mut [io::IoSliceMut::new(&mut chunk)],
            &mut ancillary,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            // A stop and continue of the process can interrupt the wait
            // (gVisor does): nothing was received, wait again.
            Err(hako_sys::rustix::io::Errno::INTR) => continue,
            other => other?,
        };
        for message in ancillary.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = message {
                fds.extend(rights);
            }
        }
        if got.bytes == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "end of file before a whole frame",
            ));
        }
        buf.extend_from_slice(&chunk[..got.bytes]);
        if want == 4 && buf.len() == 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if len > MAX_FRAME {
                return Err(invalid(format!(
                    "frame of {len} bytes is over the {MAX_FRAME}-byte limit"
                )));
            }
            want = 4 + len as usize;
        }
    }
    buf.drain(..4);
    Ok((buf, fds))
}
