//! Starting a VM: from a snapshot of an idle one when there is one for
//! this machine's shape, else by booting it (and then taking that
//! snapshot, for the next VM); then adding its virtio-fs shares and
//! telling its init the rest ([`hako_proto::VmBoot`]).
//!
//! The VMM is a driver behind [`crate::vmm::Vmm`] (QEMU's: [`crate::qemu`]).
//! A snapshot (the VMM's state, and the VM's memory beside it) is taken
//! while the guest waits for hako's boot line: its kernel booted, its
//! modules loaded, the link open, nothing of any sandbox in it yet (no
//! share is mounted, no command has run, no variable was given). What
//! differs between VMs comes after the restore: fresh randomness for the
//! kernel, then the shares' devices and the guest's mounts.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hako_container::StderrTail;
use hako_core::{Error, Result};
use hako_driver::sandbox::{GuestStart, Launcher};
use hako_proto::{VmBoot, VmMount, VM_BOOT_PREFIX};
use hako_sys::detached::DetachedMount;

use crate::virtiofs::{self, Share};
use crate::vmm::{VmProcess, Vmm, VmmControl};
use crate::NAME;

/// How long a cold boot may take to open the guest's link (TCG on a
/// loaded machine has needed tens of seconds).
const BOOT_WAIT: Duration = Duration::from_secs(300);

/// How long a share's daemon may take to end once its VM has.
const DAEMON_GRACE: Duration = Duration::from_secs(2);

/// A directory shared with the guest.
#[derive(Debug, Clone)]
pub struct ShareSpec {
    /// On the host.
    pub host: PathBuf,
    /// Inside the guest.
    pub inside: PathBuf,
    /// Read-only.
    pub read_only: bool,
    /// A copy-on-write workspace's overlay, served in place of what is
    /// at `host` (see [`virtiofs::start`]).
    pub view: Option<Arc<DetachedMount>>,
}

/// How a VM is started.
#[derive(Debug)]
pub struct VmLauncher {
    /// The VMM.
    pub vmm: Box<dyn Vmm>,
    /// Where this machine shape's snapshot is kept; `None`: always boot.
    pub snapshot: Option<PathBuf>,
    /// The shares, the workspace first.
    pub shares: Vec<ShareSpec>,
    /// The `virtiofsd` binary.
    pub virtiofsd: PathBuf,
    /// The workspace inside.
    pub workspace: PathBuf,
    /// Network mode `allow`: the way to the egress proxy.
    pub net: Option<NetLink>,
    /// `--max-file-size`, set on the guest's pid 1 (so on everything).
    pub file_size: Option<u64>,
    /// `--max-open-files` likewise.
    pub open_files: Option<u64>,
    /// What the guest does to itself before it serves.
    pub seal: Option<hako_proto::Seal>,
    /// How the guest tells that the memory limit killed a command.
    pub memory: Option<hako_proto::MemoryWatch>,
    /// What the sandbox holds while it lives: the shares' daemons, the
    /// VMM's control.
    pub held: Arc<Mutex<Held>>,
}

/// A vm sandbox's way to the egress proxy: the guest's bridge carries
/// the forwarder's connections over a second port (see
/// [`hako_relay::mux`]) to hako's, which connects each to the proxy.
#[derive(Debug, Clone)]
pub struct NetLink {
    /// The proxy's socket on the host.
    pub proxy: PathBuf,
    /// The guest's listeners, and the socket path the forwarder uses
    /// inside (the guest's bridge listens there).
    pub spec: hako_proto::NetSpec,
}

/// What a running VM's launcher holds.
#[derive(Debug, Default)]
pub struct Held {
    shares: Vec<Share>,
    control: Option<Box<dyn VmmControl>>,
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
    /// Starts a new VMM from the snapshot at `state` (its memory beside it).
    fn restore(&self, state: &Path) -> std::io::Result<VmProcess> {
        let file = std::fs::File::open(state)?;
        let memory = std::fs::File::open(ram_path(state))?;
        let mut vm = self
            .vmm
            .spawn(Some(OwnedFd::from(memory)), false)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        match vm.control.restore(&file) {
            Ok(()) => Ok(vm),
            Err(e) => {
                let _ = vm.child.kill();
                let _ = vm.child.wait();
                Err(e)
            }
        }
    }

    /// Boots a new VM until its guest waits for the boot line; then, if
    /// a snapshot is to be kept, saves it and lets the VM go on. With no
    /// snapshot to keep, the shares' devices are added before the VM
    /// starts (found at boot, not hot-plugged later); returns whether they
    /// were.
    fn boot(&self, shares: &mut [Share]) -> Result<(VmProcess, StartKind, Duration, bool)> {
        let start = Instant::now();
        let early = self.snapshot.is_none();
        let mut vm = self.vmm.spawn(None, early)?;
        if early {
            let plugged = self.plug(vm.control.as_mut(), shares).and_then(|()| {
                vm.control
                    .resume()
                    .map_err(|e| failed("boot the VM", format!("start it: {e}")))
            });
            if let Err(e) = plugged {
                let _ = vm.child.kill();
                let _ = vm.child.wait();
                return Err(e);
            }
        }
        if let Err(e) = vm.control.wait_guest_ready(BOOT_WAIT) {
            let said = ended(&mut vm);
            return Err(failed(
                "boot the VM",
                format!("the guest did not open its link: {e}{said}"),
            ));
        }
        let ready_after = start.elapsed();
        let mut kind = StartKind::Cold;
        if let Some(path) = &self.snapshot {
            match vm.control.save(path) {
                Ok(()) => {
                    kind = StartKind::ColdSaved;
                    prune(path);
                }
                Err(e) => tracing::debug!("vm: no snapshot kept at {}: {e}", path.display()),
            }
            // Saved or not, the VM goes on (it is paused for the save).
            if let Err(e) = vm.control.resume() {
                let _ = vm.child.kill();
                let _ = vm.child.wait();
                return Err(failed(
                    "boot the VM",
                    format!("resume after the snapshot: {e}"),
                ));
            }
        }
        Ok((vm, kind, ready_after, early))
    }

    /// Starts one `virtiofsd` a share (before QEMU, so that each is ready
    /// by the time its device is added).
    fn start_daemons(&self) -> Result<Vec<Share>> {
        self.shares
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                virtiofs::start(
                    &self.virtiofsd,
                    &spec.host,
                    spec.read_only,
                    spec.view.as_ref(),
                    tag(i),
                )
                .map_err(|e| {
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
    fn plug(&self, control: &mut dyn VmmControl, shares: &mut [Share]) -> Result<()> {
        for (i, (share, spec)) in shares.iter_mut().zip(&self.shares).enumerate() {
            let socket = share
                .socket
                .take()
                .ok_or_else(|| failed("share a directory", "virtiofsd's socket is gone"))?;
            let added = control.add_share(i, &share.tag, &socket);
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
            net: self.net.as_ref().map(|n| n.spec.socket.clone()),
        };
        let mut line = VM_BOOT_PREFIX.as_bytes().to_vec();
        line.extend(serde_json::to_vec(&boot).map_err(|e| failed("start the VM", e.to_string()))?);
        line.push(b'\n');
        Ok(line)
    }
}

/// Adds the guest's network port and serves hako's end of it: each stream
/// the guest opens is a new connection to the proxy at `proxy`. The
/// bridge's thread ends with the VM (its end of the port closes).
fn bridge(control: &mut dyn VmmControl, proxy: &Path) -> Result<()> {
    let (ours, vmm) = std::os::unix::net::UnixStream::pair().map_err(|source| Error::Io {
        op: "make the VM's network port",
        source,
    })?;
    control
        .add_port(NET_PORT, &vmm)
        .map_err(|e| failed("set up the network", format!("add the network port: {e}")))?;
    drop(vmm);
    let out = ours.try_clone().map_err(|source| Error::Io {
        op: "make the VM's network port",
        source,
    })?;
    let mux = hako_relay::mux::Mux::new(Box::new(out));
    let proxy = proxy.to_path_buf();
    std::thread::Builder::new()
        .name("hako-vm-net".into())
        .spawn(move || {
            let connect = || std::os::unix::net::UnixStream::connect(&proxy);
            if let Err(e) = mux.serve(ours, Some(&connect)) {
                tracing::debug!("vm: the network bridge ended: {e}");
            }
        })
        .map_err(|source| Error::Io {
            op: "start the VM's network bridge",
            source,
        })?;
    Ok(())
}

/// The guest's network port (its bridge's).
const NET_PORT: &str = "hako-net";

/// The file of a snapshot's memory, beside its state.
pub(crate) fn ram_path(state: &Path) -> PathBuf {
    state.with_extension("ram")
}

/// Kills a VM that failed, and returns what it and its console said,
/// last lines.
fn ended(vm: &mut VmProcess) -> String {
    let _ = vm.child.kill();
    let _ = vm.child.wait();
    let said = vm.tail.text(Duration::from_secs(1));
    let lines: Vec<&str> = said.lines().rev().take(5).collect();
    if lines.is_empty() {
        String::new()
    } else {
        format!(
            "; the VM said: {}",
            lines.into_iter().rev().collect::<Vec<_>>().join("; ")
        )
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

/// The most snapshots an image keeps (one a machine shape: memory, CPUs,
/// accelerator), about 100 MiB of memory each.
const KEEP_SNAPSHOTS: usize = 6;

/// Removes the least recently written snapshots past [`KEEP_SNAPSHOTS`]
/// from `keep`'s directory, never `keep`.
fn prune(keep: &Path) {
    let Some(dir) = keep.parent() else {
        return;
    };
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
        let VmProcess {
            mut child,
            mut control,
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
                    self.plug(control.as_mut(), &mut shares)
                }
            })
            .and_then(|()| match &self.net {
                Some(net) => bridge(control.as_mut(), &net.proxy),
                None => Ok(()),
            });
        if let Err(e) = line {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e);
        }
        held.shares = shares;
        held.control = Some(control);
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
            network: self.net.as_ref().map(|n| n.spec.clone()),
            seal: self.seal.clone(),
            memory: self.memory.clone(),
        })
    }

    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf> {
        Some(self.workspace.join(rel))
    }

    fn close(&self, _guest_exited_cleanly: bool) {
        if let Ok(mut held) = self.held.lock() {
            held.control = None;
            let shares = std::mem::take(&mut held.shares);
            if self.waits_for_guest() {
                // QEMU has ended (its end was waited for): each daemon
                // ends by itself, and with it the mount namespace that
                // holds the overlay's clone, before the layers are let go.
                for share in shares {
                    share.finish(DAEMON_GRACE);
                }
            }
            // Otherwise each daemon is killed and reaped as it is dropped.
        }
    }

    /// With a copy-on-write workspace: its overlay must be let go before
    /// its layers are (reviewed, committed, or mounted by the next
    /// sandbox), so the VM's end is waited for, then its daemons'.
    fn waits_for_guest(&self) -> bool {
        self.shares.iter().any(|s| s.view.is_some())
    }
}
