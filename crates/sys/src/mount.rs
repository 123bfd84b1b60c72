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
pub(crate) fn locked_flags(path: &Path) -> io::Result<libc::c_ulong> {
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

/// Which mounts a remount changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The mount at the path only (the mounts below it keep their flags:
    /// for a directory whose submounts are set up apart, such as `/dev`).
    Mount,
    /// The mount at the path and every mount below it (for a recursive
    /// bind: a host mount below a directory bound read-only must not stay
    /// writable).
    Subtree,
}

/// Adds `flags` (`MS_RDONLY`, `MS_NOSUID`, `MS_NODEV`, `MS_NOEXEC`) to the
/// mount at `path`, and with [`Reach::Subtree`] to every mount below it,
/// with `mount_setattr(2)`: it only sets what it is given, so the flags the
/// kernel locked stay as they are. `Ok(false)` where the kernel has no
/// `mount_setattr` (before Linux 5.12).
fn set_mount_flags(path: &Path, flags: libc::c_ulong, reach: Reach) -> io::Result<bool> {
    let mut attr_set = 0u64;
    for (ms_flag, attr) in [
        (libc::MS_RDONLY, 0x1u64),
        (libc::MS_NOSUID, 0x2),
        (libc::MS_NODEV, 0x4),
        (libc::MS_NOEXEC, 0x8),
    ] {
        if flags & ms_flag != 0 {
            attr_set |= attr;
        }
    }
    if flags & !(libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC) != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("flags {flags:#x} cannot be set on a mount"),
        ));
    }
    // struct mount_attr: attr_set, attr_clr, propagation, userns_fd.
    let attr: [u64; 4] = [attr_set, 0, 0, 0];
    let at_flags = match reach {
        Reach::Mount => 0,
        Reach::Subtree => libc::AT_RECURSIVE,
    };
    let c = c_path(path)?;
    // SAFETY: a valid C string, a mount_attr-sized buffer of plain data that
    // outlives the call (the kernel only reads it), and its size.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            at_flags,
            attr.as_ptr(),
            std::mem::size_of_val(&attr),
        )
    };
    if ret == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOSYS) {
        return Ok(false);
    }
    Err(with_context(
        err,
        format!("mount_setattr {}", path.display()),
    ))
}

/// Remounts the bind mount at `path` (and with [`Reach::Subtree`] every
/// mount below it) read-only, adding `extra` flags and keeping the ones the
/// kernel locked. On a kernel before 5.12 only the mount at `path` changes.
pub fn remount_readonly(path: &Path, extra: libc::c_ulong, reach: Reach) -> io::Result<()> {
    remount(path, libc::MS_RDONLY | extra, reach)
}

/// Remounts the bind mount at `path` (and with [`Reach::Subtree`] every
/// mount below it) with `extra` flags (e.g. nosuid, nodev), keeping the
/// locked ones and its read-write state. On a kernel before 5.12 only the
/// mount at `path` changes.
pub fn remount_flags(path: &Path, extra: libc::c_ulong, reach: Reach) -> io::Result<()> {
    remount(path, extra, reach)
}

/// Adds `flags` to the bind mount at `path`: with `mount_setattr` where the
/// kernel has it, else with a remount of that mount alone that keeps its
/// locked flags.
fn remount(path: &Path, flags: libc::c_ulong, reach: Reach) -> io::Result<()> {
    if set_mount_flags(path, flags, reach)? {
        return Ok(());
    }
    let flags = locked_flags(path)? | flags;
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
