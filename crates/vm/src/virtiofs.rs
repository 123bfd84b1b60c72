//! The workspace (and each `--ro`/`--rw` bind) shared live with the guest
//! over virtio-fs, served by `virtiofsd`: the guest's kernel mounts it, and
//! with no cache on either side a write from one side is seen by the other
//! at once, so the fence's file API on the host and the commands inside
//! agree.
//!
//! One `virtiofsd` a share, in its own namespaces (its `--sandbox
//! namespace`: the shared directory is its whole root) under its own
//! seccomp filter that kills it on any system call it does not need. It
//! gets its listening socket as descriptor 3; hako connects to it at once
//! and hands the connected end to QEMU, so no socket is left on disk
//! beyond those few moments, in a directory only hako's user can enter.

use std::io;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hako_sys::detached::DetachedMount;

/// The variable naming the `virtiofsd` binary.
pub const VIRTIOFSD_VAR: &str = "HAKO_VIRTIOFSD";

/// Where `virtiofsd` is looked for when the variable is not set: beside
/// hako, where distributions install it, then `PATH`.
const PLACES: &[&str] = &["/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"];

/// The `virtiofsd` to run, if one is found.
pub fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os(VIRTIOFSD_VAR) {
        return Some(PathBuf::from(path));
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("virtiofsd")));
    beside
        .into_iter()
        .chain(PLACES.iter().map(PathBuf::from))
        .chain(
            std::env::var_os("PATH")
                .map(|p| {
                    std::env::split_paths(&p)
                        .map(|d| d.join("virtiofsd"))
                        .collect::<Vec<_>>()
                })
                .unwrap_or_default(),
        )
        .find(|p| p.is_file())
}

/// A running `virtiofsd`, and QEMU's end of its socket until handed over.
#[derive(Debug)]
pub struct Share {
    /// The daemon (killed when dropped).
    pub child: Child,
    /// The connected socket, for QEMU's chardev.
    pub socket: Option<UnixStream>,
    /// The device's tag.
    pub tag: String,
}

impl Share {
    /// Waits up to `grace` for the daemon to end by itself (it does once
    /// its VM has: its socket closes), then kills it. Ended by itself, it
    /// has also reaped its sandbox's process, whose mount namespace (with
    /// a copy-on-write workspace's overlay in it) is then gone; killed,
    /// that process follows it a moment later.
    pub fn finish(mut self, grace: Duration) {
        let until = Instant::now() + grace;
        while Instant::now() < until {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(5)),
                _ => break,
            }
        }
        // Drop kills what is left and reaps it.
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `virtiofsd`'s command line for `dir`: no cache (every access reaches
/// the host, so both sides see each other's writes at once), its
/// namespace sandbox, seccomp that kills, errors only.
pub fn argv(virtiofsd: &Path, dir: &Path, read_only: bool) -> Vec<String> {
    let mut argv = vec![
        virtiofsd.display().to_string(),
        "--fd=3".into(),
        format!("--shared-dir={}", dir.display()),
        "--sandbox=namespace".into(),
        "--seccomp=kill".into(),
        "--cache=never".into(),
        "--log-level=error".into(),
    ];
    if read_only {
        argv.push("--readonly".into());
    }
    argv
}

/// Starts `virtiofsd` sharing `dir`, and connects to it. With `view`
/// (a copy-on-write workspace's overlay), the daemon serves that in
/// place of what is at `dir`: it is attached there in a mount namespace
/// of the daemon's own before it starts, never in the host's.
pub fn start(
    virtiofsd: &Path,
    dir: &Path,
    read_only: bool,
    view: Option<&Arc<DetachedMount>>,
    tag: String,
) -> io::Result<Share> {
    let private = tempfile::Builder::new().prefix("hako-vm-").tempdir()?;
    // tempfile makes the directory 0700.
    let path = private.path().join("fs.sock");
    let listener = UnixListener::bind(&path)?;
    let prepare = view
        .map(|view| view.attach_at(dir).map(crate::runner::Prepare::Attach))
        .transpose()?;
    let child = crate::runner::spawn_tied(
        &argv(virtiofsd, dir, read_only),
        Some(std::os::fd::OwnedFd::from(listener)),
        prepare,
    )?;
    let mut share = Share {
        child,
        socket: None,
        tag,
    };
    // The listener is bound: the connection waits in its backlog until
    // virtiofsd accepts it.
    share.socket = Some(UnixStream::connect(&path)?);
    drop(private);
    Ok(share)
}
