//! What the container backends share: the static guest they mount, the
//! names and labels that tie a container to the hako process that owns it,
//! the environment, the limit reports, and the stderr kept of a runtime's
//! client.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use hako_core::env::EnvPolicy;
use hako_core::{Error, LimitMechanism, LimitReport, Limits, NetworkAccess, Result};
use hako_driver::network::NetworkSetup;
use hako_driver::sandbox::{GuestStart, Launcher};

use crate::runner::Runner;

/// Where the guest binary appears inside every container.
pub const GUEST_INSIDE: &str = "/.hako-guest";

/// The variable naming a statically linked `hako-guest`.
pub const STATIC_GUEST_VAR: &str = "HAKO_GUEST_STATIC";

/// The label every container hako starts carries: the owner's pid.
pub const LABEL_PID: &str = "hako.owner.pid";
/// The owner's start time (clock ticks since boot), so that a reused pid
/// is not taken for the owner.
pub const LABEL_START: &str = "hako.owner.start";

/// Whether the ELF file at `path` asks for no program interpreter (it
/// then needs no libc from the image). `None` when it is not a 64-bit
/// little-endian ELF file or cannot be read.
pub fn is_static_elf(path: &Path) -> Option<bool> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let phoff = u64::from_le_bytes(header[0x20..0x28].try_into().ok()?);
    let phentsize = usize::from(u16_at(&header, 0x36));
    let phnum = usize::from(u16_at(&header, 0x38));
    if phentsize < 4 || phnum > 4096 {
        return None;
    }
    let mut table = vec![0u8; phentsize * phnum];
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(phoff)).ok()?;
    file.read_exact(&mut table).ok()?;
    const PT_INTERP: u32 = 3;
    let has_interp = table
        .chunks_exact(phentsize)
        .any(|ph| u32::from_le_bytes([ph[0], ph[1], ph[2], ph[3]]) == PT_INTERP);
    Some(!has_interp)
}

/// The file name of the static guest hako looks for beside itself
/// (`scripts/build` puts it beside `hako` in `target/release`).
pub const STATIC_GUEST_NAME: &str = "hako-guest-static";

/// The command that builds the static guest beside `hako`, for hints.
pub const STATIC_GUEST_BUILD: &str = "./scripts/build";

/// The statically linked guest to mount into a container: `explicit`, else
/// `$HAKO_GUEST_STATIC`, else [`STATIC_GUEST_NAME`] beside the running
/// executable (or one directory up, where Cargo puts binaries relative to
/// tests), else the `hako-guest` hako would run on the host if it happens
/// to be static. An image brings no libc hako can rely on.
///
/// The running `hako` itself is taken last, and only when it is linked
/// statically (as the Python wheel's and `scripts/build`'s are): it carries
/// the guest and runs it when started under a guest name, so an
/// installation of `hako` alone runs containers too. The guest's own
/// executable is preferred where there is one: it links nothing of the
/// driver, the backends or the egress proxy.
pub fn locate_static_guest(backend: &str, explicit: Option<&Path>) -> Result<PathBuf> {
    find_static_guest(explicit).map_err(|reason| Error::Backend {
        backend: backend.into(),
        op: "find the static hako-guest",
        message: format!("{reason}: {}", static_guest_hint()),
    })
}

/// What to do when no static guest is found.
pub fn static_guest_hint() -> String {
    format!(
        "build it with `{STATIC_GUEST_BUILD}` (which puts {STATIC_GUEST_NAME} beside hako), or set {STATIC_GUEST_VAR} to a static hako-guest (scripts/build-static-guest prints one)"
    )
}

/// [`locate_static_guest`]'s search; the reason when it finds none.
fn find_static_guest(explicit: Option<&Path>) -> std::result::Result<PathBuf, String> {
    let chosen = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(STATIC_GUEST_VAR).map(PathBuf::from));
    if let Some(path) = chosen {
        return match is_static_elf(&path) {
            Some(true) => Ok(path.canonicalize().unwrap_or(path)),
            Some(false) => Err(format!(
                "{} is dynamically linked; the guest runs inside the image, which has no libc hako can rely on",
                path.display()
            )),
            None => Err(format!(
                "{} is not a readable 64-bit ELF executable",
                path.display()
            )),
        };
    }
    let exe = std::env::current_exe().ok();
    if let Some(found) = beside(exe.as_deref(), STATIC_GUEST_NAME) {
        return match is_static_elf(&found) {
            Some(true) => Ok(found.canonicalize().unwrap_or(found)),
            _ => Err(format!(
                "{} is not a statically linked executable",
                found.display()
            )),
        };
    }
    match hako_driver::connection::locate_guest() {
        Ok(path) if exe.as_deref() == Some(path.as_path()) => match is_static_elf(&path) {
            Some(true) => Ok(path.canonicalize().unwrap_or(path)),
            _ => Err(format!(
                "no static hako-guest found (no {STATIC_GUEST_NAME} beside hako, and hako itself is dynamically linked)"
            )),
        },
        Ok(path) if is_static_elf(&path) == Some(true) => Ok(path.canonicalize().unwrap_or(path)),
        Ok(path) => Err(format!(
            "no static hako-guest found (no {STATIC_GUEST_NAME} beside hako, and the hako-guest found, {}, is dynamically linked; the guest runs inside the image)",
            path.display()
        )),
        Err(_) => Err(format!(
            "no static hako-guest found (no {STATIC_GUEST_NAME} beside hako)"
        )),
    }
}

/// Why a container backend cannot start here, and the one thing to do
/// about it, chosen by the cause found (for `hako doctor`, and for the
/// servers' check at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotReady {
    /// What is missing or failed.
    pub reason: String,
    /// What fixes that cause.
    pub hint: String,
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; hint: {}", self.reason, self.hint)
    }
}

/// Whether a static guest is found ([`locate_static_guest`]), as a
/// [`NotReady`] when not.
pub fn static_guest_ready() -> std::result::Result<PathBuf, NotReady> {
    find_static_guest(None).map_err(|reason| NotReady {
        reason,
        hint: static_guest_hint(),
    })
}

/// `name` in the directory of `exe` or the one above, if it is a file.
fn beside(exe: Option<&Path>, name: &str) -> Option<PathBuf> {
    let mut dir = exe?.parent();
    for _ in 0..2 {
        let d = dir?;
        let candidate = d.join(name);
        if candidate.is_file() {
            return Some(candidate);
        }
        dir = d.parent();
    }
    None
}

/// hako's seccomp policy as the OCI profile a container runtime applies.
///
/// For gVisor under Docker (`--runtime runsc`; the `gvisor` backend's guest
/// installs the compiled program itself, whose refusals keep their errno),
/// rules answering anything but `EPERM` are left out: runsc (2022-12)
/// ignores `errnoRet` and answers `EPERM` to every refusal, and
/// `clone3` refused with `EPERM` instead of `ENOSYS` breaks every program
/// that starts a thread (libc falls back to `clone` only on `ENOSYS`).
/// `clone3`'s flags cannot be read by a filter anyway; under gVisor a user
/// namespace it could make gives no capability on the host. `sealed`: the
/// guest seals itself (see `docker::RunPlan::seals`), so `mount` is left
/// to the filter it installs.
pub fn seccomp_profile(gvisor: bool, sealed: bool) -> serde_json::Value {
    let mut policy = hako_seccomp::default_policy();
    if gvisor {
        policy
            .rules
            .retain(|rule| rule.action == hako_seccomp::Action::Errno(hako_seccomp::EPERM));
    }
    if sealed {
        // The guest mounts its masks first, then installs the whole
        // default policy on itself (`mount` refused again) before it
        // serves: no command ever runs without it.
        policy.rules.retain(|rule| rule.syscall != "mount");
    }
    hako_seccomp::to_oci(&policy)
}

/// This process's identity as the labels record it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    /// The pid.
    pub pid: u32,
    /// Its start time in clock ticks since boot (0 when unknown).
    pub start: u64,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            pid,
            start: hako_sys::proc::start_time(pid).unwrap_or(0),
        }
    }

    /// Whether the process the labels name still runs.
    pub fn alive(&self) -> bool {
        match hako_sys::proc::start_time(self.pid) {
            Some(start) => self.start == 0 || start == self.start,
            None => false,
        }
    }
}

/// A name no other sandbox of any process has: owner pid, a counter and
/// the time.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos:08x}", std::process::id())
}

/// The environment commands start from: the policy's, with HOME and TMPDIR
/// at the container's private /tmp and PATH the standard one unless set
/// explicitly (the host's PATH names the host's directories, not the
/// image's; every entry missing there is a failed lookup per command).
pub fn base_env(policy: &EnvPolicy) -> Vec<(String, String)> {
    hako_driver::sandbox::base_env_defaulting(
        policy,
        &[
            ("HOME", "/tmp"),
            ("TMPDIR", "/tmp"),
            ("PATH", hako_core::env::DEFAULT_PATH),
        ],
    )
}

/// Reports for the limits a container enforces: memory, pids and CPUs by
/// the runtime's cgroups, file size and open files by rlimits.
pub fn limit_reports(limits: &Limits) -> Vec<LimitReport> {
    hako_driver::sandbox::resource_limit_reports(limits, LimitMechanism::Runtime)
}

/// [`limit_reports`] for a sandbox whose guest counts `--pids` itself in
/// the sandbox's own kernel (gVisor, sealed: see `Seal::pids_max`).
pub fn limit_reports_pids_inside(limits: &Limits) -> Vec<LimitReport> {
    let mut reports = limit_reports(limits);
    for r in &mut reports {
        if r.kind == hako_core::LimitKind::Pids {
            r.mechanism = LimitMechanism::SandboxKernel;
        }
    }
    reports
}

/// Says that the memory limit is the guest's (its watch, under gVisor:
/// see [`memory_watch`]); the runtime's cgroup, set higher, is only the
/// backstop.
pub fn memory_by_the_guest(reports: &mut [LimitReport]) {
    for r in reports {
        if r.kind == hako_core::LimitKind::Memory {
            r.mechanism = LimitMechanism::Supervisor;
        }
    }
}

/// The least memory a gVisor sandbox's host cgroup gets beyond `--memory`:
/// that cgroup holds gVisor's own kernel (about 15 MiB idle, measured with
/// runsc 2022-12) as well as the memory of the commands, and a command
/// past the limit is stopped inside, by the guest's watch (see
/// [`memory_watch`]), before the host's limit ends the whole sandbox. The
/// watch looks every few milliseconds, but a single system call (a
/// `read` into a 256 MiB buffer) fills memory before gVisor delivers the
/// kill: the headroom is what such a burst may take.
pub const GVISOR_MEMORY_HEADROOM: u64 = 256 << 20;

/// The host cgroup's memory limit of a gVisor sandbox given `--memory
/// limit`: the limit, plus the limit again or [`GVISOR_MEMORY_HEADROOM`],
/// whichever is more. It stays the backstop: an allocation that outruns
/// the guest's watch through the headroom ends the sandbox, and hako then
/// names the memory limit as the likely cause.
pub fn gvisor_host_memory(limit: u64) -> u64 {
    limit.saturating_add(limit.max(GVISOR_MEMORY_HEADROOM))
}

/// How a container's guest tells that `--memory` killed a command: under
/// runc the kernel's kill count, in the container's own memory cgroup as
/// the container sees it (v1 or v2); under gVisor, whose memory cgroup
/// inside does not enforce, the guest's own watch.
pub fn memory_watch(limits: &Limits, gvisor: bool) -> Option<hako_proto::MemoryWatch> {
    let limit = limits.memory?;
    Some(if gvisor {
        hako_proto::MemoryWatch::Watch { limit }
    } else {
        hako_proto::MemoryWatch::Counter(vec![
            "/sys/fs/cgroup/memory/memory.oom_control".into(),
            "/sys/fs/cgroup/memory.events".into(),
        ])
    })
}

/// `cpus_milli` as the decimal the runtimes take (`1500` is `1.5`).
pub fn cpus_decimal(milli: u64) -> String {
    format!("{}.{:03}", milli / 1000, milli % 1000)
}

/// The last bytes a runtime's client wrote to stderr, kept as they come.
#[derive(Debug, Clone, Default)]
pub struct StderrTail {
    inner: Arc<(Mutex<Kept>, Condvar)>,
}

/// The bytes kept, and whether the stream has closed.
type Kept = (Vec<u8>, bool);

/// How much of a client's stderr is kept.
const TAIL_BYTES: usize = 4096;

impl StderrTail {
    /// Drains `stderr` on a thread of its own until it closes.
    pub fn follow(stderr: impl Read + Send + 'static) -> StderrTail {
        let tail = StderrTail::default();
        let inner = Arc::clone(&tail.inner);
        let spawned = std::thread::Builder::new()
            .name("hako-runtime-stderr".into())
            .spawn(move || {
                let mut stderr = stderr;
                let mut buf = [0u8; 4096];
                loop {
                    let n = match stderr.read(&mut buf) {
                        Ok(0) | Err(_) => 0,
                        Ok(n) => n,
                    };
                    let Ok(mut kept) = inner.0.lock() else { return };
                    if n == 0 {
                        kept.1 = true;
                        inner.1.notify_all();
                        return;
                    }
                    kept.0.extend_from_slice(&buf[..n]);
                    let excess = kept.0.len().saturating_sub(TAIL_BYTES);
                    kept.0.drain(..excess);
                }
            });
        if spawned.is_err() {
            if let Ok(mut kept) = tail.inner.0.lock() {
                kept.1 = true;
            }
        }
        tail
    }

    /// The tail, once the stream has closed or `wait` has passed.
    pub fn text(&self, wait: Duration) -> String {
        let Ok(kept) = self.inner.0.lock() else {
            return String::new();
        };
        let kept = match self.inner.1.wait_timeout_while(kept, wait, |k| !k.1) {
            Ok((kept, _)) => kept,
            Err(_) => return String::new(),
        };
        String::from_utf8_lossy(&kept.0).trim().to_string()
    }
}

/// A container whose entrypoint is the guest, reached through its
/// runtime client's stdio (`docker run -i`, `runsc run`).
#[derive(Debug)]
pub struct ContainerLauncher {
    /// The backend's name.
    pub backend: &'static str,
    /// The runtime's name, for messages.
    pub program: &'static str,
    /// Runs the runtime's CLI.
    pub runner: Arc<dyn Runner>,
    /// The container's name.
    pub name: String,
    /// The client's argv.
    pub argv: Vec<String>,
    /// The workspace on the host.
    pub workspace: PathBuf,
    /// Commands run at close, in order, to make sure the container is
    /// gone (their failures are only logged).
    pub cleanup: Vec<Vec<String>>,
    /// Files the runtime reads while the container lives; dropped (and so
    /// removed) at close.
    pub keep: Mutex<Vec<Box<dyn std::fmt::Debug + Send>>>,
    /// The sandbox's end of the egress proxy, for the guest to set up.
    pub network: Option<hako_proto::NetSpec>,
    /// What the guest does to itself before it serves, where the runtime
    /// leaves it to the guest (gVisor's masks).
    pub seal: Option<hako_proto::Seal>,
    /// How the guest tells that the memory limit killed a command.
    pub memory: Option<hako_proto::MemoryWatch>,
    /// Whether a process of its own removes what `keep` holds once the
    /// client exits (gVisor's bundle: see `hako_gvisor::host_view`).
    pub self_cleaning: bool,
}

/// What a gVisor sandbox's end is put down to when it has a memory limit:
/// the one way a command ends the whole sandbox by design (see
/// [`gvisor_host_memory`]).
fn memory_hint(limit: u64) -> String {
    format!(
        "; the sandbox's memory limit (--memory {} MiB) is the likely cause: under gVisor a command past it is killed by hako's watch inside, but one that fills memory faster than the watch can stop it (a single huge read or allocation) reaches the host's limit, {} MiB, which ends the whole sandbox; give it a larger --memory or make the command use less",
        limit >> 20,
        gvisor_host_memory(limit) >> 20
    )
}

fn spawn_error(backend: &str, argv: &[String], e: &std::io::Error) -> Error {
    if let Some(found) = hako_sys::exhaust::diagnose(e) {
        return Error::OutOfResources {
            op: "start the container",
            resource: found.resource,
            message: found.message,
        };
    }
    let program = argv.first().map(String::as_str).unwrap_or("");
    let message = if e.kind() == std::io::ErrorKind::NotFound {
        format!("{program} is not installed")
    } else {
        format!("cannot run {program}: {e}")
    };
    Error::Backend {
        backend: backend.into(),
        op: "start the container",
        message,
    }
}

impl Launcher for ContainerLauncher {
    fn start(&self) -> Result<GuestStart> {
        let mut child = self
            .runner
            .spawn(&self.argv)
            .map_err(|e| spawn_error(self.backend, &self.argv, &e))?;
        let tail = match child.stderr.take() {
            Some(stderr) => StderrTail::follow(stderr),
            None => StderrTail::default(),
        };
        let name = self.name.clone();
        let program = self.program;
        let memory_hint = match &self.memory {
            Some(hako_proto::MemoryWatch::Watch { limit }) => memory_hint(*limit),
            _ => String::new(),
        };
        let describe = Box::new(move || {
            // The client exits (and closes stderr) right after the
            // container: give it a moment to say why.
            let said = tail.text(Duration::from_secs(3));
            // Drop the CLI's generic advice; keep what it said went wrong.
            let said = said
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with("Run '"))
                .collect::<Vec<_>>()
                .join("; ");
            if said.is_empty() {
                format!("container {name} ended ({program} said nothing){memory_hint}")
            } else {
                format!("container {name} ended; {program} said: {said}{memory_hint}")
            }
        });
        Ok(GuestStart::Piped {
            child,
            describe,
            network: self.network.clone(),
            seal: self.seal.clone(),
            memory: self.memory.clone(),
        })
    }

    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf> {
        Some(self.workspace.join(rel))
    }

    fn close(&self, guest_exited_cleanly: bool) {
        // The guest has ended and the client, which exits with status 0
        // only once the container is gone, has been waited for; when
        // either went wrong, this makes sure of it.
        let cleanup: &[Vec<String>] = if guest_exited_cleanly {
            &[]
        } else {
            &self.cleanup
        };
        for argv in cleanup {
            if let Ok(out) = self.runner.output(argv) {
                let message = out.message();
                let gone = message.to_ascii_lowercase().contains("no such container")
                    || message.contains("does not exist")
                    || message.contains("not found");
                if !out.success && !gone {
                    tracing::debug!("{}: cleaning up {}: {message}", self.backend, self.name);
                }
            }
        }
        if let Ok(mut keep) = self.keep.lock() {
            keep.clear();
        }
    }

    fn cleans_up_after_itself(&self) -> bool {
        self.self_cleaning
    }

    fn abandon(&self) {
        // The container is still ending, and its cleaner removes these
        // once it has: not dropped (which would remove them now).
        if let Ok(mut keep) = self.keep.lock() {
            for held in keep.drain(..) {
                std::mem::forget(held);
            }
        }
    }
}

/// Size of the private `/tmp` when none is given.
pub const DEFAULT_TMP_SIZE: u64 = 512 << 20;

/// The network a container gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunNetwork {
    /// `--network none`: loopback only.
    None,
    /// `--network none`, and the egress proxy's socket directory (this host
    /// path) bound read-only at `hako_driver::network::NET_DIR`.
    Proxy(PathBuf),
    /// `--network host`.
    Host,
}

impl RunNetwork {
    /// What a sandbox's network setup asks of its container.
    pub fn of(network: &NetworkSetup) -> RunNetwork {
        match (network.access, network.socket_dir()) {
            (NetworkAccess::Host, _) => RunNetwork::Host,
            (_, Some(dir)) => RunNetwork::Proxy(dir),
            (_, None) => RunNetwork::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dynamic_executable_is_told_from_a_static_one() {
        // This test binary is linked like the normal build: dynamically.
        let me = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(is_static_elf(&me), Some(false));
        assert_eq!(is_static_elf(Path::new("/etc/hostname")), None);
        if let Some(path) = std::env::var_os(STATIC_GUEST_VAR) {
            assert_eq!(is_static_elf(Path::new(&path)), Some(true));
        }
    }

    #[test]
    fn owner_of_this_process_is_alive_and_a_dead_pid_is_not() {
        let me = Owner::current();
        assert!(me.start > 0);
        assert!(me.alive());
        let reused = Owner {
            pid: me.pid,
            start: me.start + 1,
        };
        assert!(!reused.alive(), "a reused pid is not the owner");
        let gone = Owner {
            pid: u32::MAX - 1,
            start: 1,
        };
        assert!(!gone.alive());
    }

    #[test]
    fn cpus_render_as_decimals() {
        assert_eq!(cpus_decimal(1500), "1.500");
        assert_eq!(cpus_decimal(250), "0.250");
    }
}
