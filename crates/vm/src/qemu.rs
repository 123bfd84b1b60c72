//! The QEMU driver of the vm backend ([`crate::vmm`]): QEMU started in its
//! jail ([`crate::jail`]) with the command line of [`crate::qemu_argv`],
//! and driven over QMP ([`crate::qmp`]) on a socket it inherited.
//!
//! A snapshot is QEMU's migration stream with the memory left out
//! (`x-ignore-shared`: the VM's memory is the jail's RAM file, shared),
//! and beside it that memory, copied sparse from the RAM file while the VM
//! is paused. A restore fills the new jail's RAM file from it before QEMU
//! starts (QEMU would otherwise page through the whole memory of a stream,
//! zeroed pages included), then loads the state.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hako_container::StderrTail;
use hako_core::{Error, Result};
use serde_json::json;

use crate::launcher::ram_path;
use crate::qmp::Qmp;
use crate::vmm::{Tails, VmProcess, Vmm, VmmControl};
use crate::NAME;

/// How long restoring or saving a snapshot may take.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(120);

fn failed(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: NAME.into(),
        op,
        message: message.into(),
    }
}

/// QEMU, as a vm sandbox starts it.
#[derive(Debug)]
pub struct Qemu {
    /// Its command line (see [`crate::qemu_argv`]), without `-incoming`
    /// or `-S`.
    pub argv: Vec<String>,
    /// Where it runs.
    pub jail: Arc<hako_sys::jail::Jail>,
}

impl Vmm for Qemu {
    fn spawn(&self, memory: Option<OwnedFd>, paused: bool) -> Result<VmProcess> {
        let (ours, qemus) = UnixStream::pair().map_err(|source| Error::Io {
            op: "make QEMU's control socket",
            source,
        })?;
        let (console, console_qemus) = UnixStream::pair().map_err(|source| Error::Io {
            op: "make the VM's console socket",
            source,
        })?;
        let mut argv = self.argv.clone();
        if memory.is_some() {
            argv.extend(["-incoming".into(), "defer".into()]);
        }
        if paused {
            argv.push("-S".into());
        }
        let mut child = crate::runner::spawn_tied(
            &argv,
            Some(OwnedFd::from(qemus)),
            Some(crate::runner::Prepare::Jail(crate::runner::Jailed {
                jail: Arc::clone(&self.jail),
                fd4: OwnedFd::from(console_qemus),
                ram_from: memory,
            })),
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
            vmm: child
                .stderr
                .take()
                .map(StderrTail::follow)
                .unwrap_or_default(),
        };
        match Qmp::connect(ours) {
            Ok(qmp) => Ok(VmProcess {
                control: Box::new(QemuControl {
                    qmp,
                    pid: child.id(),
                }),
                child,
                tail,
            }),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                let said = tail.text(Duration::from_secs(1));
                Err(failed(
                    "start QEMU",
                    format!("{e}; QEMU said: {}", said.trim()),
                ))
            }
        }
    }
}

/// A running QEMU's QMP.
#[derive(Debug)]
struct QemuControl {
    qmp: Qmp,
    pid: u32,
}

/// Hands `socket` to QEMU as a character device named `id`, for a device
/// added next to use.
fn socket_chardev<'q>(
    qmp: &'q mut Qmp,
    id: &str,
    socket: &UnixStream,
) -> std::io::Result<&'q mut Qmp> {
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
    Ok(qmp)
}

impl VmmControl for QemuControl {
    fn add_port(&mut self, name: &str, socket: &UnixStream) -> std::io::Result<()> {
        let id = format!("port-{name}");
        let qmp = socket_chardev(&mut self.qmp, &id, socket)?;
        qmp.execute(
            "device_add",
            Some(json!({
                "driver": "virtserialport",
                "bus": "vser.0",
                "id": format!("{id}-dev"),
                "chardev": id,
                "name": name,
            })),
        )
        .map(drop)
    }

    fn wait_guest_ready(&mut self, within: Duration) -> std::io::Result<()> {
        self.qmp
            .wait_event(within, |e| {
                e["event"] == "VSERPORT_CHANGE"
                    && e["data"]["id"] == "hako"
                    && e["data"]["open"] == true
            })
            .map(drop)
    }

    fn restore(&mut self, state: &std::fs::File) -> std::io::Result<()> {
        let qmp = &mut self.qmp;
        ignore_shared(qmp)?;
        qmp.execute_with_fd(
            "getfd",
            Some(json!({"fdname": "snapshot"})),
            Some(state.as_fd()),
        )?;
        qmp.execute("migrate-incoming", Some(json!({"uri": "fd:snapshot"})))?;
        qmp.poll("query-migrate", SNAPSHOT_WAIT, migration_done)?;
        qmp.execute("cont", None).map(drop)
    }

    fn save(&mut self, path: &Path) -> std::io::Result<()> {
        save(&mut self.qmp, self.pid, path)
    }

    fn resume(&mut self) -> std::io::Result<()> {
        self.qmp.execute("cont", None).map(drop)
    }

    fn add_share(&mut self, index: usize, tag: &str, socket: &UnixStream) -> std::io::Result<()> {
        let id = format!("fs{index}");
        let qmp = socket_chardev(&mut self.qmp, &id, socket)?;
        qmp.execute(
            "device_add",
            Some(json!({
                "driver": "vhost-user-fs-pci",
                "id": format!("{id}-dev"),
                "chardev": id,
                "tag": tag,
            })),
        )
        .map(drop)
    }
}

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
    Ok(())
}
