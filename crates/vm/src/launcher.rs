//! Starting a VM: from a snapshot of an idle one when there is one for
//! this machine's shape, else by booting it (and then taking that
//! snapshot, for the next VM); then adding its virtio-fs shares and
//! telling its init the rest ([`hako_proto::VmBoot`]).
//!
//! A snapshot is QEMU's migration stream (the devices' state) and the VM's
//! memory (a file, copied into the jail's RAM file before the restored
//! QEMU starts: QEMU would otherwise page through the whole of a stream's
//! memory, zeroed pages included), written while the guest waits for
//! hako's boot line: its kernel booted, its modules
//! loaded, the link open, nothing of any sandbox in it yet (no share is
//! mounted, no command has run, no variable was given). What differs
//! between VMs comes after the restore: fresh randomness for the kernel,
//! then the shares' devices, added over QMP, and the guest's mounts.

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hako_container::StderrTail;
use hako_core::{Error, Result};
use hako_driver::sandbox::{GuestStart, Launcher};
use hako_proto::{VmBoot, VmMount, VM_BOOT_PREFIX};
use serde_json::json;

use crate::qmp::Qmp;
use crate::virtiofs::{self, Share};
use crate::NAME;

/// How long a cold boot may take to open the guest's link (TCG on a
/// loaded machine has needed tens of seconds).
const BOOT_WAIT: Duration = Duration::from_secs(300);
/// How long restoring or saving a snapshot may take.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(120);

/// A directory shared with the guest.
#[derive(Debug, Clone)]
pub struct ShareSpec {
    /// On the host.
    pub host: PathBuf,
    /// Inside the guest.
    pub inside: PathBuf,
    /// Read-only.
    pub read_only: bool,
}

/// How a VM is started (see [`crate::QemuPlan`] for its command line).
#[derive(Debug)]
pub struct VmLauncher {
    /// QEMU's command line, without `-incoming`.
    pub argv: Vec<String>,
    /// Where this machine shape's snapshot is kept; `None`: always boot.
    pub snapshot: Option<PathBuf>,
    /// The shares, the workspace first.
    pub shares: Vec<ShareSpec>,
    /// The `virtiofsd` binary.
    pub virtiofsd: PathBuf,
    /// The workspace inside.
    pub workspace: PathBuf,
    /// `--max-file-size`, set on the guest's pid 1 (so on everything).
    pub file_size: Option<u64>,
    /// `--max-open-files` likewise.
    pub open_files: Option<u64>,
    /// What the guest does to itself before it serves.
    pub seal: Option<hako_proto::Seal>,
    /// How the guest tells that the memory limit killed a command.
    pub memory: Option<hako_proto::MemoryWatch>,
    /// Where QEMU runs (see [`crate::jail`]).
    pub jail: Arc<hako_sys::jail::Jail>,
    /// What the sandbox holds while it lives: the shares' daemons, QMP.
    pub held: Arc<Mutex<Held>>,
}

/// What a running VM's launcher holds.
#[derive(Debug, Default)]
pub struct Held {
    shares: Vec<Share>,
    qmp: Option<Qmp>,
    /// How the last start went (for `hako bench` and tests).
    pub started: Option<StartReport>,
}

/// How a VM was started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartKind {
    /// Booted, and its snapshot taken.
    ColdSaved,
    /// Booted (no snapshot could be kept).
    Cold,
    /// Restored from a snapshot.
    Restored,
}

/// How long a start took, and which kind it was.
#[derive(Debug, Clone, Copy)]
pub struct StartReport {
    /// Which.
    pub kind: StartKind,
    /// From QEMU's start to the guest waiting for its boot line (restored
    /// or booted), snapshot saving not counted.
    pub ready_after: Duration,
}

fn failed(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: NAME.into(),
        op,
        message: message.into(),
    }
}

impl VmLauncher {
    /// Starts QEMU in its jail; with `ram_from` (a snapshot's memory), the
    /// jail's RAM file is filled from it, and QEMU waits for the rest of
    /// the snapshot.
    fn spawn_qemu(&self, ram_from: Option<OwnedFd>, paused: bool) -> Result<Running> {
        let restore = ram_from.is_some();
        let (ours, qemus) = UnixStream::pair().map_err(|source| Error::Io {
            op: "make QEMU's control socket",
            source,
        })?;
        let (console, console_qemus) = UnixStream::pair().map_err(|source| Error::Io {
            op: "make the VM's console socket",
            source,
        })?;
        let mut argv = self.argv.clone();
        if restore {
            argv.extend(["-incoming".into(), "defer".into()]);
        }
        if paused {
            argv.push("-S".into());
        }
        let mut child = crate::runner::spawn_tied(
            &argv,
            Some(OwnedFd::from(qemus)),
            Some(crate::runner::Jailed {
                jail: Arc::clone(&self.jail),
                fd4: OwnedFd::from(console_qemus),
                ram_from,
            }),
        )
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                failed("start QEMU", format!("{} is not installed", argv[0]))
            } else {
                failed("start QEMU", format!("cannot run {}: {e}", argv[0]))
            }
        })?;
        // Read from now on: a console that fills its socket would stall
        // QEMU. QEMU's own complaints come on its stderr.
        let tail = Tails {
            console: StderrTail::follow(console),
            qemu: child
                .stderr
                .take()
                .map(StderrTail::follow)
                .unwrap_or_default(),
        };
        match Qmp::connect(ours) {
            Ok(qmp) => Ok(Running { child, qmp, tail }),
            Err(e) => {
                let said = qemu_said(&mut child, &tail);
                Err(failed("start QEMU", format!("{e}{said}")))
            }
        }
    }

    /// Restores the snapshot into a new QEMU, running: its memory copied
    /// into the jail's RAM file before QEMU starts, its devices' state
    /// loaded over QMP.
    fn restore(&self, snapshot: &Path) -> std::io::Result<Running> {
        let file = std::fs::File::open(snapshot)?;
        let ram = std::fs::File::open(ram_path(snapshot))?;
        let Running {
            mut child,
            mut qmp,
            tail,
        } = self
            .spawn_qemu(Some(OwnedFd::from(ram)), false)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let restored = (|| {
            ignore_shared(&mut qmp)?;
            qmp.execute_with_fd(
                "getfd",
                Some(json!({"fdname": "snapshot"})),
                Some(file.as_fd()),
            )?;
            qmp.execute("migrate-incoming", Some(json!({"uri": "fd:snapshot"})))?;
            qmp.poll("query-migrate", SNAPSHOT_WAIT, migration_done)?;
            qmp.execute("cont", None)
        })();
        match restored {
            Ok(_) => Ok(Running { child, qmp, tail }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// Boots a new QEMU until its guest waits for the boot line; then, if
    /// a snapshot is to be kept, saves it and lets the VM go on. With no
    /// snapshot to keep, the shares' devices are added before the VM
    /// starts (found at boot, not hot-plugged later); returns whether they
    /// were.
    fn boot(&self, shares: &mut [Share]) -> Result<(Running, StartKind, Duration, bool)> {
        let start = Instant::now();
        let early = self.snapshot.is_none();
        let Running {
            mut child,
            mut qmp,
            tail,
        } = self.spawn_qemu(None, early)?;
        if early {
            let plugged = self.plug(&mut qmp, shares).and_then(|()| {
                qmp.execute("cont", None)
                    .map_err(|e| failed("boot the VM", format!("start it: {e}")))
            });
            if let Err(e) = plugged {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e);
            }
        }
        let opened = qmp.wait_event(BOOT_WAIT, |e| {
            e["event"] == "VSERPORT_CHANGE"
                && e["data"]["id"] == "hako"
                && e["data"]["open"] == true
        });
        if let Err(e) = opened {
            let said = qemu_said(&mut child, &tail);
            return Err(failed(
                "boot the VM",
                format!("the guest did not open its link: {e}{said}"),
            ));
        }
        let ready_after = start.elapsed();
        let mut kind = StartKind::Cold;
        if let Some(path) = &self.snapshot {
            match save(&mut qmp, child.id(), path) {
                Ok(()) => kind = StartKind::ColdSaved,
                Err(e) => tracing::debug!("vm: no snapshot kept at {}: {e}", path.display()),
            }
            // Saved or not, the VM goes on (it is paused for the save).
            if let Err(e) = qmp.execute("cont", None) {
                let _ = child.kill();
                return Err(failed(
                    "boot the VM",
                    format!("resume after the snapshot: {e}"),
                ));
            }
        }
        Ok((Running { child, qmp, tail }, kind, ready_after, early))
    }

    /// Starts one `virtiofsd` a share (before QEMU, so that each is ready
    /// by the time its device is added).
    fn start_daemons(&self) -> Result<Vec<Share>> {
        self.shares
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                virtiofs::start(&self.virtiofsd, &spec.host, spec.read_only, tag(i)).map_err(|e| {
                    failed(
                        "share a directory",
                        format!(
                            "cannot start {} for {}: {e}",
                            self.virtiofsd.display(),
                            spec.host.display()
                        ),
                    )
                })
            })
            .collect()
    }

    /// Adds the shares' devices to the VM (running, or paused before its
    /// boot).
    fn plug(&self, qmp: &mut Qmp, shares: &mut [Share]) -> Result<()> {
        for (i, (share, spec)) in shares.iter_mut().zip(&self.shares).enumerate() {
            let socket = share
                .socket
                .take()
                .ok_or_else(|| failed("share a directory", "virtiofsd's socket is gone"))?;
            let id = format!("fs{i}");
            let added = (|| {
                qmp.execute_with_fd("getfd", Some(json!({"fdname": id})), Some(socket.as_fd()))?;
                qmp.execute(
                    "chardev-add",
                    Some(json!({
                        "id": id,
                        "backend": {"type": "socket", "data": {
                            "addr": {"type": "fd", "data": {"str": id}},
                            "server": false
                        }}
                    })),
                )?;
                qmp.execute(
                    "device_add",
                    Some(json!({
                        "driver": "vhost-user-fs-pci",
                        "id": format!("{id}-dev"),
                        "chardev": id,
                        "tag": share.tag,
                    })),
                )
            })();
            drop(socket);
            if let Err(e) = added {
                let said = daemon_said(share);
                return Err(failed(
                    "share a directory",
                    format!("add {}'s device: {e}{said}", spec.host.display()),
                ));
            }
        }
        Ok(())
    }

    fn boot_line(&self) -> Result<Vec<u8>> {
        let mut seed = [0u8; 64];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
            .map_err(|source| Error::Io {
                op: "read randomness for the VM",
                source,
            })?;
        let boot = VmBoot {
            seed: seed.iter().map(|b| format!("{b:02x}")).collect(),
            mounts: self
                .shares
                .iter()
                .enumerate()
                .map(|(i, spec)| VmMount {
                    tag: tag(i),
                    path: spec.inside.clone(),
                    read_only: spec.read_only,
                })
                .collect(),
            file_size: self.file_size,
            open_files: self.open_files,
        };
        let mut line = VM_BOOT_PREFIX.as_bytes().to_vec();
        line.extend(serde_json::to_vec(&boot).map_err(|e| failed("start the VM", e.to_string()))?);
        line.push(b'\n');
        Ok(line)
    }
}

/// A QEMU started, its QMP connected, its stderr followed.
struct Running {
    child: std::process::Child,
    qmp: Qmp,
    tail: Tails,
}

/// What a VM says: its console (the kernel's and the guest's messages),
/// and QEMU's own stderr.
struct Tails {
    console: StderrTail,
    qemu: StderrTail,
}

impl Tails {
    /// Both, QEMU's first, waiting at most `wait` for each to end.
    fn text(&self, wait: Duration) -> String {
        let qemu = self.qemu.text(wait);
        let console = self.console.text(wait);
        match (qemu.trim().is_empty(), console.trim().is_empty()) {
            (true, _) => console,
            (false, true) => qemu,
            (false, false) => format!("{}\n{}", qemu.trim_end(), console),
        }
    }
}

/// The device tag of share `i` (the workspace is the first).
fn tag(i: usize) -> String {
    if i == 0 {
        "workspace".to_string()
    } else {
        format!("bind-{i}")
    }
}

/// Whether a `query-migrate` answer says the migration is over.
fn migration_done(answer: &serde_json::Value) -> std::result::Result<bool, String> {
    match answer["status"].as_str() {
        Some("completed") => Ok(true),
        Some(s @ ("failed" | "cancelled")) => Err(format!(
            "the migration {s}: {}",
            answer["error-desc"].as_str().unwrap_or("no reason given")
        )),
        _ => Ok(false),
    }
}

/// The file of a snapshot's memory, beside its state.
fn ram_path(state: &Path) -> PathBuf {
    state.with_extension("ram")
}

/// Leaves the VM's memory out of the migration stream: it is a shared file
/// (the jail's RAM file), saved and restored as a file of its own.
fn ignore_shared(qmp: &mut Qmp) -> std::io::Result<()> {
    qmp.execute(
        "migrate-set-capabilities",
        Some(json!({"capabilities": [{"capability": "x-ignore-shared", "state": true}]})),
    )
    .map(drop)
}

/// An unnamed file in `dir` (named by [`name`] once complete).
fn unnamed(dir: &Path) -> std::io::Result<OwnedFd> {
    use hako_sys::rustix::fs::{openat, Mode, OFlags, CWD};
    Ok(openat(
        CWD,
        dir,
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?)
}

/// Names the unnamed `file` `path`; a file someone else named so first is
/// kept (returns whether this one was named).
fn name(file: &OwnedFd, path: &Path) -> std::io::Result<bool> {
    use hako_sys::rustix::fs::{linkat, AtFlags, CWD};
    let fd_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(file));
    match linkat(CWD, fd_path.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW) {
        Ok(()) => Ok(true),
        Err(hako_sys::rustix::io::Errno::EXIST) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Copies `from` into `to`, leaving holes where `from` has holes or
/// zeroed pages (a fresh VM's memory is mostly never written).
fn copy_sparse(from: &std::fs::File, to: &std::fs::File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let size = from.metadata()?.len();
    to.set_len(size)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    while at < size {
        let n = from.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        for (i, page) in buf[..n].chunks(4096).enumerate() {
            if page.iter().any(|&b| b != 0) {
                to.write_all_at(page, at + (i * 4096) as u64)?;
            }
        }
        at += n as u64;
    }
    Ok(())
}

/// Pauses the VM and keeps a snapshot of it at `path`: its devices' state
/// (QEMU's migration stream, the memory left out) and beside it its
/// memory, read from the jail's RAM file of QEMU `pid`. Both are written
/// to unnamed files in the same directory first, named only once complete
/// (a crash leaves no partial snapshot, and no file at all), the memory
/// first; a snapshot someone else named first is kept. The caller resumes
/// the VM.
fn save(qmp: &mut Qmp, pid: u32, path: &Path) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("a snapshot path with no directory"))?;
    std::fs::create_dir_all(dir)?;
    let state = unnamed(dir)?;
    let memory = unnamed(dir)?;
    qmp.execute("stop", None)?;
    ignore_shared(qmp)?;
    qmp.execute(
        "migrate-set-parameters",
        Some(json!({"max-bandwidth": 1u64 << 40})),
    )?;
    qmp.execute_with_fd(
        "getfd",
        Some(json!({"fdname": "snapshot"})),
        Some(state.as_fd()),
    )?;
    qmp.execute("migrate", Some(json!({"uri": "fd:snapshot"})))?;
    qmp.poll("query-migrate", SNAPSHOT_WAIT, migration_done)?;
    // The VM is paused: its memory is what the state was taken with.
    let ram = std::fs::File::open(format!("/proc/{pid}/root{}", hako_sys::jail::RAM_FILE))?;
    let memory = std::fs::File::from(memory);
    copy_sparse(&ram, &memory)?;
    name(&OwnedFd::from(memory), &ram_path(path))?;
    name(&state, path)?;
    prune(dir, path);
    Ok(())
}

/// The most snapshots an image keeps (one a machine shape: memory, CPUs,
/// accelerator), about 100 MiB of memory each.
const KEEP_SNAPSHOTS: usize = 6;

/// Removes the least recently written snapshots past [`KEEP_SNAPSHOTS`],
/// never `keep`.
fn prune(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "state") && e.path() != keep)
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    found.sort();
    let over = (found.len() + 1).saturating_sub(KEEP_SNAPSHOTS);
    for (_, path) in found.into_iter().take(over) {
        let _ = std::fs::remove_file(ram_path(&path));
        let _ = std::fs::remove_file(path);
    }
}

/// Kills a QEMU that failed, and returns what it said on stderr (its
/// console), last lines.
fn qemu_said(child: &mut std::process::Child, tail: &Tails) -> String {
    let _ = child.kill();
    let _ = child.wait();
    let said = tail.text(Duration::from_secs(1));
    let lines: Vec<&str> = said.lines().rev().take(5).collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(
            "; QEMU said: {}",
            lines.into_iter().rev().collect::<Vec<_>>().join("; ")
        )
    }
}

fn daemon_said(share: &mut Share) -> String {
    let _ = share.child.kill();
    let tail = share
        .child
        .stderr
        .take()
        .map(StderrTail::follow)
        .unwrap_or_default();
    let said = tail.text(Duration::from_secs(1));
    if said.trim().is_empty() {
        String::new()
    } else {
        format!("; virtiofsd said: {}", said.trim())
    }
}

impl Launcher for VmLauncher {
    fn start(&self) -> Result<GuestStart> {
        let start = Instant::now();
        let mut shares = self.start_daemons()?;
        let restored = self
            .snapshot
            .as_deref()
            .filter(|p| p.is_file())
            .and_then(|p| match self.restore(p) {
                Ok(running) => Some(running),
                Err(e) => {
                    // A snapshot this QEMU cannot load (another version):
                    // boot, and keep a new one.
                    tracing::debug!("vm: snapshot {} not restored: {e}", p.display());
                    let _ = std::fs::remove_file(p);
                    let _ = std::fs::remove_file(ram_path(p));
                    None
                }
            });
        let (running, kind, ready_after, plugged) = match restored {
            Some(running) => (running, StartKind::Restored, start.elapsed(), false),
            None => self.boot(&mut shares)?,
        };
        let Running {
            mut child,
            mut qmp,
            tail,
        } = running;
        let mut held = self
            .held
            .lock()
            .map_err(|_| failed("start the VM", "the launcher's lock is poisoned"))?;
        // The boot line first: the guest reseeds and starts waiting for its
        // shares while their devices are added.
        let line = self
            .boot_line()
            .and_then(|line| {
                let stdin = child
                    .stdin
                    .as_mut()
                    .ok_or_else(|| failed("start the VM", "QEMU's stdin is gone"))?;
                stdin.write_all(&line).map_err(|source| Error::Io {
                    op: "tell the VM's guest its boot line",
                    source,
                })
            })
            .and_then(|()| {
                if plugged {
                    Ok(())
                } else {
                    self.plug(&mut qmp, &mut shares)
                }
            });
        if let Err(e) = line {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        held.shares = shares;
        held.qmp = Some(qmp);
        held.started = Some(StartReport { kind, ready_after });
        let describe = Box::new(move || {
            let said = tail.text(Duration::from_secs(3));
            let said: Vec<&str> = said
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect();
            let said = said[said.len().saturating_sub(40)..].join("\n");
            if said.is_empty() {
                "the VM ended (QEMU said nothing)".to_string()
            } else {
                format!("the VM ended; its console and QEMU said: {said}")
            }
        });
        Ok(GuestStart::Piped {
            child,
            describe,
            network: None,
            seal: self.seal.clone(),
            memory: self.memory.clone(),
        })
    }

    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf> {
        Some(self.workspace.join(rel))
    }

    fn close(&self, _guest_exited_cleanly: bool) {
        if let Ok(mut held) = self.held.lock() {
            held.qmp = None;
            // Each daemon is killed and reaped as it is dropped.
            held.shares.clear();
        }
    }
}
