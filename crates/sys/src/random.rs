//! Fresh randomness for a kernel restored from a snapshot: the bytes are
//! mixed into the input pool and the kernel's generator is reseeded at
//! once (`RNDRESEEDCRNG`), so two VMs started from one snapshot do not
//! draw the same numbers.

use std::io::{self, Write};
use std::os::fd::AsRawFd;

/// `_IO('R', 0x07)`.
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Mixes `seed` into the kernel's pool, then reseeds its generator (which
/// needs `CAP_SYS_ADMIN`).
pub fn reseed(seed: &[u8]) -> io::Result<()> {
    let mut urandom = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    urandom.write_all(seed)?;
    // SAFETY: a request with no argument on a descriptor open for the
    // call's length.
    let ret = unsafe { libc::ioctl(urandom.as_raw_fd(), RNDRESEEDCRNG as _) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
