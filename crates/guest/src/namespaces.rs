//! Building a `linux` sandbox around the command.
//!
//! The guest runs as two processes:
//!
//! 1. The **launcher** (the process hako started, still in hako's pid
//!    namespace) clones its child into new user, mount, pid, IPC, UTS and
//!    cgroup namespaces and maps the child's uid and gid.
//! 2. The child is **pid 1** of the new pid namespace. While a thread of it
//!    makes the network namespace (loopback up), it builds the filesystem
//!    view on a fresh tmpfs, `pivot_root`s into it and detaches the host's
//!    tree, names the host, enters the network namespace, and then serves
//!    commands exactly as the host guest does (see
//!    [`server`](crate::server)), each confined just before exec (rlimits,
//!    Landlock, no_new_privs, no capabilities, seccomp).
//!
//! When pid 1 exits the kernel kills every process left in the namespace.
//! Pid 1 dies with the launcher (`PR_SET_PDEATHSIG`), and the launcher
//! turns SIGINT, SIGTERM and SIGHUP into a SIGKILL of pid 1, so no path
//! leaves anything running.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Component, Path, PathBuf};

use hako_sys::mount::{self as m, fd_path};
use hako_sys::ns::{self, Forked, SingleThreaded};
use hako_sys::rustix::fs::{self as rfs, Mode, OFlags};
use hako_sys::rustix::process::{self as rproc, Pid, Signal, WaitOptions};
use hako_sys::signal::{signum, SignalFd};

use crate::error::{failed, failed_on};
use crate::lockdown::Confinement;
use crate::proto::{FromGuest, LinuxSpec, MountOp};
use crate::server::Mode as ServeMode;
use crate::{GuestError, GuestExit};

/// Where the new root is assembled, inside the new mount namespace only.
const STAGING: &str = "/tmp";

/// The namespaces pid 1 is cloned into (with a new pid namespace). Its
/// network namespace pid 1 makes itself, on a thread of its own while it
/// builds the view (see [`ns::NetworkNamespace::make_aside`]): it is most
/// of the kernel's work, and so a sandbox is ready sooner.
const CLONED_NAMESPACES: i32 = ns::CLONE_NEWUSER
    | ns::CLONE_NEWNS
    | ns::CLONE_NEWIPC
    | ns::CLONE_NEWUTS
    | ns::CLONE_NEWCGROUP
    | ns::CLONE_NEWPID;

/// Moves process `pid` into the sandbox's cgroups (their `cgroup.procs`
/// files): a `linux` sandbox's pid 1, or a `landlock` sandbox's guest.
pub(crate) fn join_cgroups(cgroup_procs: &[PathBuf], pid: i32) -> Result<(), GuestError> {
    for file in cgroup_procs {
        std::fs::write(file, pid.to_string()).map_err(failed_on("join cgroup", file))?;
    }
    Ok(())
}

/// Builds the sandbox `spec` describes and serves commands from its pid 1
/// until hako closes `ctl`. Returns the launcher's exit code.
pub(crate) fn start(spec: &LinuxSpec, ctl: UnixStream, proof: &SingleThreaded) -> GuestExit {
    match spawn_pid1(spec, &ctl, proof) {
        Err(err) => {
            refuse(&ctl, &err);
            GuestExit::Failed
        }
        Ok(pid) => {
            // Pid 1 holds the connection; hako sees it close when pid 1 ends.
            drop(ctl);
            wait_for_init(pid)
        }
    }
}

/// Creates pid 1 of a new sandbox as a child of this process, in new user,
/// mount, pid, network, IPC, UTS and cgroup namespaces (this process stays
/// outside them). Pid 1 builds the view `spec` describes and then serves
/// `ctl`, answering [`FromGuest::Ready`] or [`FromGuest::Refused`] first.
/// Returns pid 1's pid; in the child it never returns.
pub(crate) fn spawn_pid1(
    spec: &LinuxSpec,
    ctl: &UnixStream,
    proof: &SingleThreaded,
) -> Result<i32, GuestError> {
    // Checked and compiled once, before any command, and before pid 1
    // exists, so that pid 1 has less to do before it builds the view.
    let mut confinement = Confinement::new(spec)?;
    confinement.compile_seccomp()?;
    // Likewise what pid 1 and its supervisors need to know to disguise
    // themselves and to drop their capabilities: a fork inherits it.
    let disguise = hako_sys::proc::Disguise::of_this_process()
        .map_err(failed("read this process's arguments' place"))?;
    hako_sys::confine::learn_capabilities();
    let (go_r, go_w) =
        hako_sys::rustix::pipe::pipe_with(hako_sys::rustix::pipe::PipeFlags::CLOEXEC)
            .map_err(failed("create a pipe"))?;
    match ns::fork_into_namespaces(proof, CLONED_NAMESPACES) {
        Err(err) => {
            let hint = ns::user_namespaces_allowed()
                .err()
                .unwrap_or_else(|| "user namespaces may be disabled or restricted here".into());
            Err(GuestError::FailedWithHint {
                op: "create namespaces",
                source: err.into(),
                hint: hint.into(),
            })
        }
        Ok(Forked::Child) => {
            drop(go_w);
            let code = pid1(spec, ctl, go_r, confinement, disguise, proof);
            hako_sys::spawn::exit_now(code.into())
        }
        Ok(Forked::Parent(pid)) => {
            drop(go_r);
            // The child waits for this before it does anything: its ids
            // must be mapped, and it must be counted in the cgroups before
            // it can start a process.
            let released = ns::write_id_maps_of(pid, spec.uid, spec.gid)
                .map_err(|source| GuestError::MapIds {
                    uid: spec.uid.1,
                    gid: spec.gid.1,
                    source,
                })
                .and_then(|()| join_cgroups(&spec.cgroup_procs, pid))
                .and_then(|()| {
                    hako_sys::rustix::io::write(&go_w, b"1")
                        .map(drop)
                        .map_err(failed("release pid 1"))
                });
            if let Err(err) = released {
                if let Some(p) = Pid::from_raw(pid) {
                    let _ = rproc::kill_process(p, Signal::KILL);
                    let _ = rproc::waitpid(Some(p), WaitOptions::empty());
                }
                return Err(err);
            }
            Ok(pid)
        }
    }
}

/// Pid 1 of a new sandbox, from its first instruction to its exit code.
fn pid1(
    spec: &LinuxSpec,
    ctl: &UnixStream,
    go: OwnedFd,
    confinement: Confinement,
    disguise: hako_sys::proc::Disguise,
    proof: &SingleThreaded,
) -> GuestExit {
    // While the parent maps our ids: keep only the connection (at fd 3)
    // and the go pipe, stop showing the parent's command line and
    // environment, and start making the network namespace.
    let kept = hako_sys::spawn::become_forked_helper_keeping(None, ctl.as_fd(), Some(go.as_fd()));
    // Its number was closed with every other one; it now lives at 4.
    std::mem::forget(go);
    let (ctl, go) = match kept {
        Ok((ctl, Some(go))) => (UnixStream::from(ctl), go),
        _ => return GuestExit::Failed,
    };
    // hako's arguments and environment must not show inside: fail closed.
    if let Err(e) = disguise.apply("hako-guest") {
        refuse(&ctl, &failed("hide hako's arguments from the sandbox")(e));
        return GuestExit::Failed;
    }
    // A pid 1 cloned by hako itself did not pass through the guest's entry.
    let _ = hako_sys::signal::restore_ignored_signals();
    // Until the thread making it is joined (in `set_up`, before anything
    // forks), this process has two threads.
    let network = if spec.host_network {
        None
    } else {
        Some(ns::NetworkNamespace::make_aside())
    };
    let mut confinement = confinement;
    let mut byte = [0u8; 1];
    if !matches!(hako_sys::rustix::io::read(&go, &mut byte), Ok(1)) {
        // The parent failed (and says why) or died.
        return GuestExit::Failed;
    }
    drop(go);
    // The memory limit's kill count, a host file: opened while the host's
    // view is still this process's, held by pid 1 alone (out of the
    // commands' reach like its link to hako).
    let oom = match &spec.oom_counter {
        None => None,
        Some(path) => match crate::server::memory::Oom::open_counter(std::slice::from_ref(path)) {
            Ok(oom) => Some(oom),
            Err(err) => {
                refuse(&ctl, &err);
                return GuestExit::Failed;
            }
        },
    };
    let ready = set_up(spec, network)
        .and_then(|()| confinement.prepare_landlock())
        .and_then(|()| confinement.seal_pid1());
    // The forwarder inherits the seccomp filter.
    let forwarder = ready.and_then(|()| match &spec.network {
        Some(net) => crate::forward::start(net, proof).map(Some),
        None => Ok(None),
    });
    let forwarder = match forwarder {
        Ok(forwarder) => forwarder,
        Err(err) => {
            refuse(&ctl, &err);
            return GuestExit::Failed;
        }
    };
    let ctl = match crate::server::Link::socket(ctl) {
        Ok(link) => link,
        Err(_) => return GuestExit::Failed,
    };
    crate::server::serve(
        ctl,
        proof,
        ServeMode {
            confinement: Some(confinement),
            stop_signals: false,
            accept_fds: false,
            forwarder,
            oom,
        },
    )
}

/// Pid 1's part of building a sandbox: the view, the host name, and the
/// network namespace (`None` for the host's network), which it enters.
fn set_up(
    spec: &LinuxSpec,
    network: Option<std::io::Result<ns::NetworkNamespace>>,
) -> Result<(), GuestError> {
    ns::die_with_parent().map_err(failed("set the parent-death signal"))?;
    // Pid 1 stays dumpable: an unprivileged hako must be able to join its
    // namespaces through a pidfd, which a non-dumpable target refuses. The
    // commands still cannot read its memory or /proc files: it holds
    // capabilities in the namespace that they lack, and ptrace and
    // process_vm_* are refused by seccomp.
    build_view(&spec.mounts).map_err(failed("build the sandbox's filesystem view"))?;
    ns::sethostname(&spec.hostname).map_err(failed("set the host name"))?;
    // (On the early returns above, pid 1 refuses and exits, forking
    // nothing, with the thread unjoined.)
    match network {
        None => Ok(()),
        Some(made) => made.and_then(ns::NetworkNamespace::enter).map_err(failed(
            "make the sandbox's network namespace (loopback only)",
        )),
    }
}

/// Tells hako why the sandbox cannot be served (a `Refused` frame), as
/// well as the connection allows.
fn refuse(ctl: &UnixStream, err: &GuestError) {
    let message = err.to_string();
    let errno = err.errno();
    let _ = crate::proto::write_frame(ctl, &FromGuest::Refused { message, errno });
}

/// The launcher: wait for pid 1; on a stop signal, kill it (and with it the
/// whole namespace).
fn wait_for_init(pid: i32) -> GuestExit {
    let _ = hako_sys::stdio_to_null();
    let Some(pid) = Pid::from_raw(pid) else {
        return GuestExit::NoPid1;
    };
    let signals = SignalFd::new(&[
        signum::SIGCHLD,
        signum::SIGINT,
        signum::SIGTERM,
        signum::SIGHUP,
    ]);
    loop {
        match rproc::waitpid(Some(pid), WaitOptions::NOHANG) {
            Ok(Some(_)) | Err(_) => return GuestExit::Success,
            Ok(None) => {}
        }
        match &signals {
            Ok(signals) => {
                let mut fds = [hako_sys::rustix::event::PollFd::new(
                    signals,
                    hako_sys::rustix::event::PollFlags::IN,
                )];
                let _ = hako_sys::rustix::event::poll(&mut fds, None);
                if signals.drain().iter().any(|&s| s != signum::SIGCHLD) {
                    let _ = rproc::kill_process(pid, Signal::KILL);
                }
            }
            Err(_) => {
                let _ = rproc::waitpid(Some(pid), WaitOptions::empty());
                return GuestExit::Success;
            }
        }
    }
}

/// A path inside the sandbox, relative to the staging root.
fn staged(path: &Path) -> PathBuf {
    let rel: PathBuf = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    Path::new(STAGING).join(rel)
}

fn open_path(path: &Path) -> std::io::Result<OwnedFd> {
    rfs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| std::io::Error::new(e.kind(), format!("open {}: {e}", path.display())))
}

/// Runs `make` (which creates `path`); if `path`'s directory is missing,
/// creates it and runs `make` again. Most paths of a view sit in a
/// directory made just before, so trying first saves a look-up each.
fn with_parent(path: &Path, make: impl Fn() -> std::io::Result<()>) -> std::io::Result<()> {
    match make() {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            make()
        }
        other => other,
    }
}

fn make_file(path: &Path) -> std::io::Result<()> {
    with_parent(path, || {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map(drop)
    })
}

/// A mount over `at` that is only made where `at` exists (a file or
/// directory to mask, which the host may not have): the kernel's ENOENT
/// for the target says it does not. Whether it was made.
pub(crate) fn mount_if_present(
    at: &Path,
    mount: impl FnOnce() -> std::io::Result<()>,
) -> std::io::Result<bool> {
    match mount() {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // Only the target can be missing: every source is open, or is
            // `at` itself.
            match std::fs::symlink_metadata(at) {
                Err(missing) if missing.kind() == std::io::ErrorKind::NotFound => Ok(false),
                _ => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Builds the view described by `ops` on a tmpfs at [`STAGING`] and makes it
/// the root.
fn build_view(ops: &[MountOp]) -> std::io::Result<()> {
    // No mount event of ours may reach the host.
    m::mount(None, Path::new("/"), None, m::MS_REC | m::MS_PRIVATE, None)?;
    // Open every host source first: the staging tmpfs may hide some of
    // them (a workspace under /tmp), their descriptors keep them reachable.
    let mut sources = Sources(HashMap::new());
    let null = PathBuf::from("/dev/null");
    sources.0.insert(null.clone(), open_path(&null)?);
    for op in ops {
        let wanted: Vec<&PathBuf> = match op {
            MountOp::Bind { source, .. } | MountOp::DevNode { source, .. } => vec![source],
            MountOp::Overlay {
                lower, upper, work, ..
            } => vec![lower, upper, work],
            _ => Vec::new(),
        };
        for source in wanted {
            if !sources.0.contains_key(source) {
                sources.0.insert(source.clone(), open_path(source)?);
            }
        }
    }
    let staging = Path::new(STAGING);
    m::mount(
        Some(Path::new("tmpfs")),
        staging,
        Some("tmpfs"),
        m::MS_NOSUID | m::MS_NODEV,
        Some("mode=0755"),
    )?;
    let soft = m::MS_NOSUID | m::MS_NODEV;
    for op in ops {
        apply(op, &sources, &null, soft)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{op:?}: {e}")))?;
    }
    std::env::set_current_dir(staging)?;
    // The root itself is read-only: nothing can be created beside the
    // mount points.
    m::remount_readonly(Path::new("."), soft, m::Reach::Mount)?;
    drop(sources);
    m::pivot_root_to_cwd()
}

/// The host sources of a view, by host path, opened before the staging
/// tmpfs could hide them.
struct Sources(HashMap<PathBuf, OwnedFd>);

impl Sources {
    fn opened(&self, p: &Path) -> std::io::Result<&OwnedFd> {
        self.0
            .get(p)
            .ok_or_else(|| std::io::Error::other(format!("{} was not opened", p.display())))
    }

    /// The path through which the kernel reaches source `p`.
    fn path(&self, p: &Path) -> std::io::Result<PathBuf> {
        self.opened(p).map(|fd| fd_path(fd.as_fd()))
    }

    /// Whether source `p` is a directory.
    fn is_dir(&self, p: &Path) -> std::io::Result<bool> {
        let st = rfs::fstat(self.opened(p)?)?;
        Ok(rfs::FileType::from_raw_mode(st.st_mode) == rfs::FileType::Directory)
    }
}

/// Carries out one step of the view.
fn apply(op: &MountOp, src: &Sources, null: &Path, soft: m::Flags) -> std::io::Result<()> {
    {
        match op {
            MountOp::Dir { path } => std::fs::create_dir_all(staged(path))?,
            MountOp::Tmpfs { path, options } => {
                let at = staged(path);
                std::fs::create_dir_all(&at)?;
                m::mount(
                    Some(Path::new("tmpfs")),
                    &at,
                    Some("tmpfs"),
                    soft,
                    Some(options),
                )?;
            }
            MountOp::Bind {
                source,
                path,
                read_only,
            } => {
                let at = staged(path);
                let from = src.path(source)?;
                if src.is_dir(source)? {
                    std::fs::create_dir_all(&at)?;
                } else {
                    make_file(&at)?;
                }
                m::mount(Some(&from), &at, None, m::MS_BIND | m::MS_REC, None)?;
                if *read_only {
                    m::remount_readonly(&at, soft, m::Reach::Subtree)?;
                } else {
                    m::remount_flags(&at, soft, m::Reach::Subtree)?;
                }
            }
            MountOp::DevNode { source, path } => {
                let at = staged(path);
                make_file(&at)?;
                m::mount(Some(&src.path(source)?), &at, None, m::MS_BIND, None)?;
                m::remount_flags(&at, m::MS_NOSUID | m::MS_NOEXEC, m::Reach::Mount)?;
            }
            MountOp::Proc { path } => {
                let at = staged(path);
                std::fs::create_dir_all(&at)?;
                m::mount(
                    Some(Path::new("proc")),
                    &at,
                    Some("proc"),
                    m::MS_NOSUID | m::MS_NODEV | m::MS_NOEXEC,
                    None,
                )?;
            }
            MountOp::Devpts { path } => {
                let at = staged(path);
                std::fs::create_dir_all(&at)?;
                m::mount(
                    Some(Path::new("devpts")),
                    &at,
                    Some("devpts"),
                    m::MS_NOSUID | m::MS_NOEXEC,
                    Some("newinstance,ptmxmode=0666,mode=0620"),
                )?;
            }
            MountOp::MaskFile { path } => {
                let at = staged(path);
                let null = src.path(null)?;
                mount_if_present(&at, || m::mount(Some(&null), &at, None, m::MS_BIND, None))?;
            }
            MountOp::File { path, contents } => {
                let at = staged(path);
                // Written on the staging root, bound, then unlinked: the
                // bind keeps the file, and nothing is left beside the
                // mount points.
                let file = Path::new(STAGING).join(".hako-file");
                std::fs::write(&file, contents)?;
                let bound =
                    mount_if_present(&at, || m::mount(Some(&file), &at, None, m::MS_BIND, None));
                std::fs::remove_file(&file)?;
                if bound? {
                    m::remount_readonly(&at, soft | m::MS_NOEXEC, m::Reach::Mount)?;
                }
            }
            MountOp::MaskDir { path } => {
                let at = staged(path);
                mount_if_present(&at, || {
                    m::mount(
                        Some(Path::new("tmpfs")),
                        &at,
                        Some("tmpfs"),
                        m::MS_RDONLY | m::MS_NOSUID | m::MS_NODEV | m::MS_NOEXEC,
                        Some("mode=0000,size=0"),
                    )
                })?;
            }
            MountOp::ReadOnlySelf { path } => {
                let at = staged(path);
                if mount_if_present(&at, || {
                    m::mount(Some(&at), &at, None, m::MS_BIND | m::MS_REC, None)
                })? {
                    m::remount_readonly(&at, soft, m::Reach::Subtree)?;
                }
            }
            MountOp::Symlink { target, path } => {
                let at = staged(path);
                with_parent(&at, || std::os::unix::fs::symlink(target, &at))?;
            }
            MountOp::ReadOnly { path } => {
                m::remount_readonly(&staged(path), 0, m::Reach::Mount)?;
            }
            MountOp::Overlay {
                lower,
                upper,
                work,
                path,
            } => {
                let at = staged(path);
                std::fs::create_dir_all(&at)?;
                // Each layer by its descriptor's path (`/proc/self/fd/N`):
                // no host path is resolved again, and none holds the
                // commas or colons overlayfs's options would split on.
                let options = format!(
                    "lowerdir={},upperdir={},workdir={},userxattr",
                    src.path(lower)?.display(),
                    src.path(upper)?.display(),
                    src.path(work)?.display(),
                );
                m::mount(
                    Some(Path::new("overlay")),
                    &at,
                    Some("overlay"),
                    soft,
                    Some(&options),
                )?;
            }
        }
    }
    Ok(())
}
