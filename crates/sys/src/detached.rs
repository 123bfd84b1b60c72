//! Mounts made with the new mount API (`fsopen`, `fsconfig`, `fsmount`)
//! and held by a descriptor, in no mount namespace: hako reaches files
//! through the descriptor, and a child it starts attaches the mount (a
//! clone of it) in a mount namespace of the child's own, so nothing of it
//! is ever in the host's mount table and nothing is left mounted when the
//! child and hako end, however they end.
//!
//! A `vm` sandbox's copy-on-write workspace is one: an overlay of the
//! workspace (lower) and the sandbox's upper layer, whose `virtiofsd`
//! serves the clone at the workspace's path while hako's fence works on
//! the original.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{Mode, OFlags};

/// A mount held by its descriptor (see the module's documentation).
#[derive(Debug)]
pub struct DetachedMount {
    fd: OwnedFd,
}

fn c_string(s: &[u8]) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a string"))
}

fn context(err: io::Error, what: &str) -> io::Error {
    io::Error::new(err.kind(), format!("{what}: {err}"))
}

/// `fsconfig(2)` with a string value (`Some`) or a flag (`None`).
fn fsconfig(fs: BorrowedFd<'_>, key: &str, value: Option<&CStr>) -> io::Result<()> {
    let key_c = c_string(key.as_bytes())?;
    let (cmd, value_ptr) = match value {
        Some(v) => (libc::FSCONFIG_SET_STRING, v.as_ptr()),
        None => (libc::FSCONFIG_SET_FLAG, std::ptr::null()),
    };
    // SAFETY: a file system context's descriptor, and NUL-terminated
    // strings (or null for a flag's value) that outlive the call; the
    // kernel only reads them.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            cmd,
            key_c.as_ptr(),
            value_ptr,
            0,
        )
    };
    crate::check(ret)
        .map(drop)
        .map_err(|e| context(e, &format!("overlayfs option {key}")))
}

impl DetachedMount {
    /// An overlayfs with `lower` as its lower layer and `upper` (`work`
    /// its work directory, on the same file system) as its upper one, with
    /// overlayfs's own extended attributes in the `user.` namespace (as
    /// the other backends' copy-on-write overlays, which `hako-layers`
    /// reads), and no set-id programs or devices honoured through it.
    ///
    /// Each layer is opened first, not following a symlink at its end,
    /// and named to overlayfs by that descriptor, so the layers are the
    /// directories these paths named when it was called. Where a mount
    /// table shows it (a child's that attached it), its source is the
    /// upper layer's path.
    pub fn overlay(lower: &Path, upper: &Path, work: &Path) -> io::Result<DetachedMount> {
        let layer = |what: &str, path: &Path| {
            rustix::fs::open(
                path,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| context(e.into(), &format!("open the {what} {}", path.display())))
        };
        let layers = [
            ("lowerdir", layer("lower layer", lower)?),
            ("upperdir", layer("upper layer", upper)?),
            ("workdir", layer("work directory", work)?),
        ];
        let name = c_string(b"overlay")?;
        // SAFETY: a NUL-terminated string that outlives the call.
        let fs = crate::check(unsafe {
            libc::syscall(libc::SYS_fsopen, name.as_ptr(), libc::FSOPEN_CLOEXEC)
        })
        .map_err(|e| context(e, "fsopen overlay"))?;
        // SAFETY: fsopen returned a new descriptor that nothing else owns.
        let fs = unsafe { OwnedFd::from_raw_fd(fs as i32) };
        for (key, fd) in &layers {
            let path = c_string(crate::mount::fd_path(fd.as_fd()).as_os_str().as_bytes())?;
            fsconfig(fs.as_fd(), key, Some(&path))?;
        }
        fsconfig(fs.as_fd(), "userxattr", None)?;
        // Named in mount tables by its upper layer (the layers' own paths
        // show as the descriptors they were given by).
        fsconfig(
            fs.as_fd(),
            "source",
            Some(&c_string(upper.as_os_str().as_bytes())?),
        )?;
        // SAFETY: a file system context's descriptor, no pointers.
        crate::check(unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fs.as_raw_fd(),
                libc::FSCONFIG_CMD_CREATE,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<libc::c_char>(),
                0,
            )
        })
        .map_err(|e| context(e, "create the overlay"))?;
        // SAFETY: a created context's descriptor, no pointers.
        let mnt = crate::check(unsafe {
            libc::syscall(
                libc::SYS_fsmount,
                fs.as_raw_fd(),
                libc::FSMOUNT_CLOEXEC,
                libc::MOUNT_ATTR_NOSUID | libc::MOUNT_ATTR_NODEV,
            )
        })
        .map_err(|e| context(e, "fsmount the overlay"))?;
        // SAFETY: fsmount returned a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(mnt as i32) };
        Ok(DetachedMount { fd })
    }

    /// The path through which the kernel resolves the mount's root (for
    /// opening it again, such as by the fence).
    pub fn path(&self) -> PathBuf {
        crate::mount::fd_path(self.fd.as_fd())
    }

    /// What a child attaches it with, at `target` in its own namespace
    /// (see [`Attach::enter`]).
    pub fn attach_at(self: &Arc<Self>, target: &Path) -> io::Result<Attach> {
        Ok(Attach {
            mount: Arc::clone(self),
            target: c_string(target.as_os_str().as_bytes())?,
        })
    }
}

impl AsFd for DetachedMount {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A [`DetachedMount`] to attach in a child, at a path made ready before
/// the fork.
#[derive(Debug)]
pub struct Attach {
    mount: Arc<DetachedMount>,
    target: CString,
}

impl Attach {
    /// In a child between fork and exec (system calls only): enters a
    /// mount namespace of its own, every mount in it a slave of the
    /// parent's (so nothing mounted here propagates back to the host),
    /// and mounts a clone of the mount at the target, covering what was
    /// there. Where the kernel cannot clone a detached mount (before
    /// Linux 6.15), the mount itself is moved there; it stays reachable
    /// through its descriptor.
    pub fn enter(&self) -> io::Result<()> {
        crate::ns::unshare(libc::CLONE_NEWNS)
            .map_err(|e| context(e, "unshare the mount namespace"))?;
        let root = c_string(b"/")?;
        // SAFETY: a valid C string and null pointers; the kernel only
        // reads them.
        let ret = unsafe {
            libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_SLAVE,
                std::ptr::null(),
            )
        };
        if ret != 0 {
            return Err(context(io::Error::last_os_error(), "make / a slave"));
        }
        let empty = c_string(b"")?;
        // SAFETY: the mount's descriptor and an empty C string with
        // AT_EMPTY_PATH: the mount itself is cloned.
        let clone = unsafe {
            libc::syscall(
                libc::SYS_open_tree,
                self.mount.fd.as_raw_fd(),
                empty.as_ptr(),
                libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC | libc::AT_EMPTY_PATH as u32,
            )
        };
        let source = if clone >= 0 {
            // SAFETY: open_tree returned a new descriptor nothing else owns.
            Some(unsafe { OwnedFd::from_raw_fd(clone as i32) })
        } else {
            let err = io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINVAL) {
                return Err(context(err, "clone the mount"));
            }
            None
        };
        let fd = source
            .as_ref()
            .map_or(self.mount.fd.as_raw_fd(), AsRawFd::as_raw_fd);
        // SAFETY: a mount's descriptor with an empty path, and the target,
        // a valid C string; the kernel only reads them.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_move_mount,
                fd,
                empty.as_ptr(),
                libc::AT_FDCWD,
                self.target.as_ptr(),
                libc::MOVE_MOUNT_F_EMPTY_PATH,
            )
        };
        crate::check(ret)
            .map(drop)
            .map_err(|e| context(e, "attach the mount"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn root() -> bool {
        rustix::process::geteuid().is_root()
    }

    #[test]
    fn an_overlay_held_by_its_descriptor_writes_its_upper_layer_only() {
        if !root() {
            assert!(
                std::env::var_os("HAKO_MUST_WORK").is_none(),
                "an overlay on the host needs root"
            );
            eprintln!("SKIPPED: an overlay on the host needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let [lower, upper, work] = ["lower", "upper", "work"].map(|n| {
            let p = dir.path().join(n);
            std::fs::create_dir(&p).unwrap();
            p
        });
        std::fs::write(lower.join("a"), "lower").unwrap();
        let mount = DetachedMount::overlay(&lower, &upper, &work).unwrap();
        let view = mount.path();
        assert_eq!(std::fs::read_to_string(view.join("a")).unwrap(), "lower");
        std::fs::write(view.join("a"), "changed").unwrap();
        assert_eq!(std::fs::read_to_string(lower.join("a")).unwrap(), "lower");
        assert_eq!(std::fs::read_to_string(upper.join("a")).unwrap(), "changed");
        // Not in this process's mount table.
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!table.contains(&upper.display().to_string()), "{table}");
    }

    #[test]
    fn a_layer_that_is_a_symlink_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let [lower, upper, work] = ["lower", "upper", "work"].map(|n| {
            let p = dir.path().join(n);
            std::fs::create_dir(&p).unwrap();
            p
        });
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&upper, &link).unwrap();
        let err = DetachedMount::overlay(&lower, &link, &work).unwrap_err();
        assert!(err.to_string().contains("upper layer"), "{err}");
    }
}
