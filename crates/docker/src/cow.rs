//! A copy-on-write workspace on the docker backend (`--cow`).
//!
//! The engine's local volume driver mounts overlayfs: a volume of type
//! `overlay` whose lower layer is the workspace and whose upper and work
//! directories are the sandbox's (`spec.cow`, made by
//! `hako_layers::state`), mounted at the workspace's path in place of its
//! bind ([`crate::plan::volume_create_argv`]). The daemon (root) mounts
//! it when the container starts and unmounts it when the container ends,
//! under runc, runsc and Podman alike; the real workspace is never
//! written, and nothing but the layered view of the layers is in the
//! container.
//!
//! The fence's file operations must see what the commands see: they are
//! put on the volume's mount point on the host ([`open_view`]), checked
//! to be that very overlay (its mount's id, file system type, lower and
//! upper directories, in `/proc/self/mountinfo`) before anything is read
//! or written through it. Where that cannot be (a user who cannot reach
//! the engine's volume directory, a rootless engine whose mounts are in
//! a namespace of its own), `--cow` is refused, never run on a writable
//! bind of the workspace.
//!
//! The volume is removed when the sandbox closes (and so when it was
//! lost: closing a lost sandbox removes what is left), and, labelled with
//! its owner like the container, by [`crate::gc::collect_volumes`] when
//! its hako was killed outright.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hako_container::runner::Runner;
use hako_container::{ContainerLauncher, Engine};
use hako_core::{Error, Result};
use hako_driver::sandbox::{GuestStart, Launcher};
use hako_fence::{Fence, FenceOptions};
use hako_sys::rustix::fs::{self as rfs, AtFlags, Mode, OFlags, StatxFlags};

use crate::plan::{volume_create_argv, CowVolume, RunPlan};
use crate::NAME;

/// What `--cow` cannot do with rootless Podman.
pub(crate) const ROOTLESS_PODMAN: &str = "--cow with rootless Podman (it mounts volumes in a user namespace of its own, out of reach of hako's file operations); run hako as root, or use --backend linux";
/// What `--cow` cannot do without the guest.
pub(crate) const WITHOUT_GUEST: &str = "--cow without the guest (docker exec mode restarts its container on a deadline, which would mount the layered view anew behind hako's file operations); use the guest";
/// What `--cow` cannot do when the volumes' directory is closed to hako.
const UNREACHABLE: &str = "--cow for a user who cannot reach the engine's volume directory (the daemon keeps it to root); run hako as root, or use --backend linux";
/// What `--cow` cannot do when the engine's mounts are out of sight.
const OUT_OF_SIGHT: &str = "--cow where the engine mounts volumes out of hako's sight (a rootless engine, or a daemon in another mount namespace); use --backend linux";

fn backend_err(op: &'static str, message: String) -> Error {
    Error::Backend {
        backend: NAME.into(),
        op,
        message,
    }
}

/// A copy-on-write workspace's volume, removed (once) by
/// [`remove`](Volume::remove) or when dropped.
#[derive(Debug)]
pub(crate) struct Volume {
    engine: Arc<Engine>,
    runner: Arc<dyn Runner>,
    name: String,
    removed: AtomicBool,
}

impl Volume {
    /// Makes the volume `cow` of `plan` (see [`volume_create_argv`]).
    pub(crate) fn create(
        engine: &Arc<Engine>,
        runner: &Arc<dyn Runner>,
        plan: &RunPlan,
        cow: &CowVolume,
    ) -> Result<Volume> {
        let out = runner
            .output(&volume_create_argv(engine, plan, cow))
            .map_err(|e| {
                backend_err(
                    "create the copy-on-write volume",
                    format!("cannot run {}: {e}", engine.name()),
                )
            })?;
        if !out.success {
            return Err(backend_err(
                "create the copy-on-write volume",
                format!("volume {}: {}", cow.name, out.message()),
            ));
        }
        Ok(Volume {
            engine: Arc::clone(engine),
            runner: Arc::clone(runner),
            name: cow.name.clone(),
            removed: AtomicBool::new(false),
        })
    }

    /// Removes the volume, once its container is gone: the engine
    /// refuses to remove a volume in use, and a container removed by
    /// `--rm` may still be going; asked again for a few seconds.
    pub(crate) fn remove(&self) {
        if self.removed.swap(true, Ordering::AcqRel) {
            return;
        }
        let argv = self.engine.command(["volume", "rm", self.name.as_str()]);
        let start = Instant::now();
        loop {
            let message = match self.runner.output(&argv) {
                Ok(out) if out.success => return,
                Ok(out) => out.message(),
                Err(e) => e.to_string(),
            };
            let lower = message.to_ascii_lowercase();
            if lower.contains("no such volume") || lower.contains("no volume with name") {
                return;
            }
            let in_use = lower.contains("in use") || lower.contains("being used");
            if !in_use || start.elapsed() > VOLUME_RM_PATIENCE {
                tracing::warn!(
                    "{NAME}: cannot remove the copy-on-write volume {}: {message} (`hako gc` removes it once this process is gone)",
                    self.name
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// How long a volume whose container is still going is waited for.
const VOLUME_RM_PATIENCE: Duration = Duration::from_secs(10);

impl Drop for Volume {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The container's launcher, and its copy-on-write volume, removed once
/// the container is.
#[derive(Debug)]
pub(crate) struct VolumeLauncher {
    pub(crate) inner: ContainerLauncher,
    pub(crate) volume: Volume,
}

impl Launcher for VolumeLauncher {
    fn start(&self) -> Result<GuestStart> {
        self.inner.start()
    }

    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf> {
        self.inner.cwd_inside(rel)
    }

    fn close(&self, guest_exited_cleanly: bool) {
        self.inner.close(guest_exited_cleanly);
        self.volume.remove();
    }

    fn waits_for_guest(&self) -> bool {
        // The volume goes after the container: always waited for.
        true
    }
}

/// The fence of a copy-on-write sandbox: on the volume's mount point on
/// the host, once it is checked to be the overlay of `cow.upper` on
/// `workspace` (so that no file operation lands beside the commands'
/// view: on an unmounted directory, or on the workspace itself). Called
/// while the container runs (the engine mounts the volume for it).
pub(crate) fn open_view(
    engine: &Engine,
    runner: &dyn Runner,
    cow: &CowVolume,
    workspace: &Path,
    options: FenceOptions,
) -> Result<Fence> {
    let argv = engine.command([
        "volume",
        "inspect",
        "--format",
        "{{.Mountpoint}}",
        cow.name.as_str(),
    ]);
    let out = runner.output(&argv).map_err(|e| {
        backend_err(
            "find the copy-on-write volume",
            format!("cannot run {}: {e}", engine.name()),
        )
    })?;
    if !out.success {
        return Err(backend_err(
            "find the copy-on-write volume",
            format!("volume {}: {}", cow.name, out.message()),
        ));
    }
    let mountpoint = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let unsupported = |capability: &'static str| Error::Unsupported {
        backend: NAME.into(),
        capability,
    };
    let root = rfs::open(
        &mountpoint,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        tracing::info!(
            "{NAME}: --cow: cannot open the volume's mount point {}: {e}",
            mountpoint.display()
        );
        unsupported(UNREACHABLE)
    })?;
    let stx = rfs::statx(&root, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID)
        .map_err(|e| backend_err("open the layered view", format!("statx: {e}")))?;
    if stx.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        return Err(backend_err(
            "open the layered view",
            "the kernel does not say which mount a directory is on (statx STATX_MNT_ID, Linux 5.8)"
                .into(),
        ));
    }
    let mountinfo =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|source| Error::Io {
            op: "read /proc/self/mountinfo",
            source,
        })?;
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let seen = find_mount(&mountinfo, stx.stx_mnt_id);
    let ours = seen.as_ref().is_some_and(|m| {
        m.fstype == "overlay"
            && m.root == Path::new("/")
            && (m.mount_point == mountpoint || m.mount_point == canonical(&mountpoint))
            && m.option("lowerdir")
                .is_some_and(|l| l == workspace || l == canonical(workspace))
            && m.option("upperdir")
                .is_some_and(|u| u == cow.upper || u == canonical(&cow.upper))
    });
    if !ours {
        tracing::info!(
            "{NAME}: --cow: {} is not the overlay of {} on {}: {seen:?}",
            mountpoint.display(),
            cow.upper.display(),
            workspace.display()
        );
        return Err(unsupported(OUT_OF_SIGHT));
    }
    // Opened again through the descriptor checked, never by its path.
    let held = PathBuf::from(format!("/proc/self/fd/{}", root.as_raw_fd()));
    let fence = Fence::open_as(&held, workspace, options)
        .map_err(|e| backend_err("open the layered view", e.to_string()));
    drop(root);
    fence
}

/// One line of `/proc/self/mountinfo`, as far as [`open_view`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    root: PathBuf,
    mount_point: PathBuf,
    fstype: String,
    /// The super block's options, each unescaped.
    options: Vec<String>,
}

impl Mount {
    /// The value of the super block's option `name=`.
    fn option(&self, name: &str) -> Option<PathBuf> {
        self.options.iter().find_map(|o| {
            o.strip_prefix(name)
                .and_then(|v| v.strip_prefix('='))
                .map(PathBuf::from)
        })
    }
}

/// The mount of id `id` in `mountinfo` (proc(5)'s format: id, parent,
/// device, root, mount point, options, optional fields up to `-`, type,
/// source, super block options; `\ooo` escapes).
fn find_mount(mountinfo: &str, id: u64) -> Option<Mount> {
    mountinfo.lines().find_map(|line| {
        let mut fields = line.split(' ');
        if fields.next()?.parse::<u64>().ok()? != id {
            return None;
        }
        let _parent = fields.next()?;
        let _device = fields.next()?;
        let root = unescape(fields.next()?);
        let mount_point = unescape(fields.next()?);
        let _options = fields.next()?;
        for field in fields.by_ref() {
            if field == "-" {
                break;
            }
        }
        let fstype = unescape(fields.next()?);
        let _source = fields.next()?;
        let options = fields.next()?.split(',').map(unescape).collect();
        Some(Mount {
            root: PathBuf::from(root),
            mount_point: PathBuf::from(mount_point),
            fstype,
            options,
        })
    })
}

/// Undoes the kernel's `\ooo` escapes (space, tab, newline, backslash
/// and, in options, comma).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
24 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
55 45 0:51 / /var/lib/docker/volumes/hako-1-0-ab/_data rw,relatime shared:4 - overlay overlay rw,lowerdir=/w,upperdir=/s/n/upper,workdir=/s/n/work,redirect_dir=nofollow,uuid=on,userxattr
56 45 0:52 / /var/lib/docker/volumes/sp\\040ace/_data rw - overlay overlay rw,lowerdir=/my\\040ws,upperdir=/s/a\\134b/upper,workdir=/s/w
57 45 0:53 /sub /elsewhere rw - overlay overlay rw,lowerdir=/w,upperdir=/s/n/upper,workdir=/s/n/work
";

    #[test]
    fn the_mount_of_a_volume_is_found_by_its_id_with_its_layers() {
        let m = find_mount(INFO, 55).unwrap_or_else(|| panic!("found"));
        assert_eq!(m.fstype, "overlay");
        assert_eq!(m.root, Path::new("/"));
        assert_eq!(
            m.mount_point,
            Path::new("/var/lib/docker/volumes/hako-1-0-ab/_data")
        );
        assert_eq!(m.option("lowerdir"), Some(PathBuf::from("/w")));
        assert_eq!(m.option("upperdir"), Some(PathBuf::from("/s/n/upper")));
        assert_eq!(m.option("upper"), None);
        assert_eq!(find_mount(INFO, 24).map(|m| m.fstype), Some("ext4".into()));
        assert_eq!(find_mount(INFO, 99), None);
        // A bind of part of an overlay is told by its root.
        assert_eq!(
            find_mount(INFO, 57).map(|m| m.root),
            Some(PathBuf::from("/sub"))
        );
    }

    #[test]
    fn escaped_paths_in_mountinfo_are_read_as_the_kernel_wrote_them() {
        let m = find_mount(INFO, 56).unwrap_or_else(|| panic!("found"));
        assert_eq!(
            m.mount_point,
            Path::new("/var/lib/docker/volumes/sp ace/_data")
        );
        assert_eq!(m.option("lowerdir"), Some(PathBuf::from("/my ws")));
        assert_eq!(m.option("upperdir"), Some(PathBuf::from("/s/a\\b/upper")));
        assert_eq!(unescape("a\\12"), "a\\12", "a short escape is kept as is");
    }
}
