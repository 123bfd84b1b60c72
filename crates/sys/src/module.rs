//! Loading a kernel module from a file (`finit_module(2)`): what a `vm`
//! sandbox's init does for the drivers its kernel builds as modules.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// Loads the module in `file` with `params` (`name=value` words, space
/// separated, as `modprobe` passes them). A module already loaded
/// (`EEXIST`) is not an error.
pub fn finit_module(file: BorrowedFd<'_>, params: &str) -> io::Result<()> {
    let params = std::ffi::CString::new(params)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in module parameters"))?;
    // SAFETY: the descriptor is open for the call's length, `params` is a
    // NUL-terminated string that outlives it; the kernel only reads both.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_finit_module,
            file.as_raw_fd(),
            params.as_ptr(),
            0 as libc::c_int,
        )
    };
    if ret == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EEXIST) {
        return Ok(());
    }
    Err(err)
}
