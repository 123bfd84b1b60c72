//! Mounts, for building a sandbox's filesystem view inside a new mount
//! namespace.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

pub use libc::{
    MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT, MS_SLAVE,
};

/// Mount flags (`MS_*`).
pub type Flags = libc::c_ulong;

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))
}

fn with_context(err: io::Error, what: String) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: {err}"))
}

/// `mount(2)`. Errors name the call and its target.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let what = || {
        format!(
            "mount {} on {} ({}, flags {flags:#x})",
            source.map_or("none".into(), |s| s.display().to_string()),
            target.display(),
            fstype.unwrap_or("-")
        )
    };
    let source = source.map(c_path).transpose()?;
    let target_c = c_path(target)?;
    let fstype = fstype
        .map(|s| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)))
        .transpose()?;
    let data = data
        .map(|s| CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput)))
        .transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that
    // lives until the call returns; the kernel only reads them.
    let ret = unsafe {
        libc::mount(
            ptr(&source),
            target_c.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    };
    if ret != 0 {
        return Err(with_context(io::Error::last_os_error(), what()));
    }
    Ok(())
}

/// The flags of the mount at `path` that an unprivileged remount must keep
/// (the kernel locks them on mounts inherited from a more privileged
/// namespace).
fn locked_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let c = c_path(path)?;
    // SAFETY: `statvfs` is plain data; zeroed is a valid value.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `st` a writable statvfs.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(with_context(
            io::Error::last_os_error(),
            format!("statvfs {}", path.display()),
        ));
    }
    let mut flags = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if st.f_flag & st_flag != 0 {
            flags |= ms_flag;
        }
    }
    Ok(flags)
}

/// Remounts the bind mount at `path` read-only, adding `extra` flags and
/// keeping the ones the kernel locked.
pub fn remount_readonly(path: &Path, extra: libc::c_ulong) -> io::Result<()> {
    let flags = locked_flags(path)? | extra;
    mount(
        None,
        path,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | flags,
        None,
    )
}

/// Remounts the bind mount at `path` with `extra` flags (e.g. nosuid,
/// nodev), keeping the locked ones and its read-write state.
pub fn remount_flags(path: &Path, extra: libc::c_ulong) -> io::Result<()> {
    let flags = locked_flags(path)? | extra;
    mount(
        None,
        path,
        None,
        libc::MS_BIND | libc::MS_REMOUNT | flags,
        None,
    )
}

/// The path through which the kernel resolves a descriptor (usable as a
/// bind-mount source even when the original path is hidden by a mount).
pub fn fd_path(fd: BorrowedFd<'_>) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Makes the current directory the root: `pivot_root(".", ".")`, then
/// detaches the old root stacked on top of it, so nothing of the host's
/// mount tree stays reachable.
pub fn pivot_root_to_cwd() -> io::Result<()> {
    let dot = c_path(Path::new("."))?;
    // SAFETY: both pointers are the same valid C string, read by the kernel.
    let ret = unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) };
    if ret != 0 {
        return Err(with_context(
            io::Error::last_os_error(),
            "pivot_root".into(),
        ));
    }
    // SAFETY: a valid C string and an integer flag.
    if unsafe { libc::umount2(dot.as_ptr(), libc::MNT_DETACH) } != 0 {
        return Err(with_context(
            io::Error::last_os_error(),
            "detach the old root".into(),
        ));
    }
    std::env::set_current_dir("/")
}
