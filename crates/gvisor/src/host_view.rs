//! `hako-guest --host-view`: the one mode of the guest that runs on the
//! host, not inside a sandbox. It binds host directories into a gVisor
//! bundle's root view, in a mount namespace of its own, and then becomes
//! `runsc`.
//!
//! Every directory `runsc` is given as a bind mount of the bundle is served
//! by a gofer connection of its own, set up at every start (about 7 ms
//! apiece here). Directories bound into the root view on the host side
//! instead are served through the root's connection. The binds exist only
//! in the new mount namespace, which `runsc` and its gofer inherit and which
//! ends with them: nothing is mounted in the host's namespace, and removing
//! the bundle afterwards cannot descend into a host directory.
//!
//! With `--remove BUNDLE`, a cleaner forked first (in the host's mount
//! namespace) waits for this process, `runsc` by then, to exit and then
//! removes the bundle: a `hako run` that exits once its command is
//! reported leaves the sandbox's teardown to it and need not wait (see
//! `hako_driver::ExitFollowsClose`). The cleaner adds itself to
//! the bundle's `owner` file, so that no other hako process collects the
//! bundle as stale while it works; if it is killed, the bundle is
//! collected as usual once every owner is gone.
//!
//! With `--cow WORKSPACE UPPER WORK` (a copy-on-write sandbox), the first
//! thing mounted in the new namespace is an overlayfs on the workspace's
//! own path: its lower layer the workspace, its upper and work directories
//! those given (the named sandbox's, outside the workspace and every bind).
//! `runsc`, its gofer and the bundle's bind of the workspace then find the
//! layered view where the workspace is, and every change lands in the
//! upper layer; the real workspace is never written. It is mounted with
//! `userxattr`, as the `linux` backend mounts its own: the same layers
//! serve either backend, and no redirected directory or metacopy file is
//! ever made (the review engine refuses both). If it cannot be mounted,
//! nothing runs: the mode fails and says why (never the workspace bound
//! writable in its place).
//!
//! Argv: `--host-view ROOT [--bind SOURCE INSIDE]... [--cow WORKSPACE UPPER
//! WORK] [--remove BUNDLE] -- PROGRAM [ARG]...`, where `INSIDE` is an
//! absolute path inside the view (a directory or file already made there).
//!
//! `--host-view --stat-probe` ([`STAT_PROBE`]) is the one use of the mode
//! inside gVisor: run there by `runsc do` (see `crate::everyday`), it
//! makes the `statx` and `fstatat` calls GNU coreutils make, with
//! `AT_NO_AUTOMOUNT`, and prints what each returned ([`stat_probe`]).

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use hako_sys::mount::{self, Reach};

use hako_guest::{GuestError, GuestExit};

/// The argument that selects this mode.
pub const FLAG: &str = "--host-view";

/// What `--host-view` was asked to do.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// The root view (the bundle's rootfs).
    pub root: PathBuf,
    /// `(host source, path inside the view)`.
    pub binds: Vec<(PathBuf, PathBuf)>,
    /// The bundle the cleaner removes once the program has exited.
    pub remove: Option<PathBuf>,
    /// The copy-on-write workspace to mount first, if any.
    pub cow: Option<CowMount>,
    /// What to run once they are mounted.
    pub program: Vec<OsString>,
}

/// The overlay `--cow` mounts: `workspace` (a host path) seen through
/// overlayfs, itself the lower layer.
#[derive(Debug, PartialEq, Eq)]
pub struct CowMount {
    /// The workspace: the lower layer, and where the overlay is mounted.
    pub workspace: PathBuf,
    /// The upper layer.
    pub upper: PathBuf,
    /// overlayfs's work directory (on the upper layer's file system).
    pub work: PathBuf,
}

/// The argument that gives [`CowMount`]'s three directories.
pub const COW_FLAG: &str = "--cow";

/// The argument (right after [`FLAG`]) that makes the mode print
/// [`stat_probe`]'s line instead.
pub const STAT_PROBE: &str = "--stat-probe";

/// What `statx` and `newfstatat` return here for `/` with the flags GNU
/// `ls -l` and `stat` pass (`AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT`), as
/// one line: `--stat-probe statx=E newfstatat=E`, each `E` the call's
/// errno, 0 when it succeeded. gVisor before release-20230227.0 answers
/// `statx` with `EINVAL` for that flag, and before release-20231030.0
/// `newfstatat` too (see `crate::everyday`).
pub fn stat_probe() -> String {
    use hako_sys::rustix::fs::{statat, statx, AtFlags, StatxFlags, CWD};
    let flags = AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT;
    let statx = statx(CWD, "/", flags, StatxFlags::BASIC_STATS).map(drop);
    let fstatat = statat(CWD, "/", flags).map(drop);
    let errno = |r: hako_sys::rustix::io::Result<()>| r.err().map_or(0, |e| e.raw_os_error());
    format!(
        "{STAT_PROBE} statx={} newfstatat={}",
        errno(statx),
        errno(fstatat)
    )
}

/// Reads [`stat_probe`]'s line: the errnos of `statx` and `newfstatat`
/// (0: succeeded).
pub fn parse_stat_probe(text: &str) -> Option<(i32, i32)> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next()? == STAT_PROBE).then_some(())?;
        let statx = words.next()?.strip_prefix("statx=")?.parse().ok()?;
        let fstatat = words.next()?.strip_prefix("newfstatat=")?.parse().ok()?;
        Some((statx, fstatat))
    })
}

/// Reads the argv that follows [`FLAG`].
pub fn parse(args: &[OsString]) -> Result<Plan, GuestError> {
    let usage = |message: &str| GuestError::Usage(message.to_string());
    let mut it = args.iter();
    let root = PathBuf::from(it.next().ok_or_else(|| usage("no root view given"))?);
    if !root.is_absolute() {
        return Err(GuestError::Usage(format!(
            "the root view {} is not absolute",
            root.display()
        )));
    }
    let mut binds = Vec::new();
    let mut remove = None;
    let mut cow = None;
    loop {
        match it.next().and_then(|a| a.to_str()) {
            Some(COW_FLAG) => {
                let (Some(workspace), Some(upper), Some(work)) = (it.next(), it.next(), it.next())
                else {
                    return Err(usage(
                        "--cow needs the workspace, the upper and the work directory",
                    ));
                };
                let dirs = [workspace, upper, work].map(PathBuf::from);
                if let Some(relative) = dirs.iter().find(|d| !d.is_absolute()) {
                    return Err(GuestError::Usage(format!(
                        "--cow {}: not absolute",
                        relative.display()
                    )));
                }
                let [workspace, upper, work] = dirs;
                cow = Some(CowMount {
                    workspace,
                    upper,
                    work,
                });
            }
            Some("--remove") => {
                let dir = PathBuf::from(
                    it.next()
                        .ok_or_else(|| usage("--remove needs a directory"))?,
                );
                if !dir.is_absolute() {
                    return Err(GuestError::Usage(format!(
                        "--remove {}: not absolute",
                        dir.display()
                    )));
                }
                remove = Some(dir);
            }
            Some("--bind") => {
                let (Some(source), Some(inside)) = (it.next(), it.next()) else {
                    return Err(usage("--bind needs a source and a path inside the view"));
                };
                let (source, inside) = (PathBuf::from(source), PathBuf::from(inside));
                if !source.is_absolute() || !inside.is_absolute() {
                    return Err(GuestError::Usage(format!(
                        "--bind {} {}: both paths must be absolute",
                        source.display(),
                        inside.display()
                    )));
                }
                if inside.components().any(|c| {
                    !matches!(
                        c,
                        std::path::Component::RootDir | std::path::Component::Normal(_)
                    )
                }) {
                    return Err(GuestError::Usage(format!(
                        "--bind: {} is not a plain path",
                        inside.display()
                    )));
                }
                binds.push((source, inside));
            }
            Some("--") => break,
            _ => {
                return Err(usage(
                    "expected --bind, --cow, --remove or -- before the program",
                ))
            }
        }
    }
    let program: Vec<OsString> = it.cloned().collect();
    if program.is_empty() {
        return Err(usage("no program to run after --"));
    }
    Ok(Plan {
        root,
        binds,
        remove,
        cow,
        program,
    })
}

/// Where the absolute path `inside` is in the view at `root`.
pub fn in_view(root: &Path, inside: &Path) -> PathBuf {
    root.join(inside.strip_prefix("/").unwrap_or(inside))
}

/// A line of a bundle's `owner` file: `pid start` (the start time in clock
/// ticks since boot, 0 when unknown). hako writes the first, the cleaner
/// appends its own.
pub fn owner_line(pid: u32, start: u64) -> String {
    format!("{pid} {start}\n")
}

/// The `(pid, start)` of every line of a bundle's `owner` file; `None`
/// for a file that is not one.
pub fn parse_owners(text: &str) -> Option<Vec<(u32, u64)>> {
    let owners = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut words = line.split_whitespace();
            let owner = (words.next()?.parse().ok()?, words.next()?.parse().ok()?);
            words.next().is_none().then_some(owner)
        })
        .collect::<Option<Vec<_>>>()?;
    (!owners.is_empty()).then_some(owners)
}

/// The overlayfs options of `cow`, its layers named by the descriptors
/// given (`/proc/self/fd/N`): no path is resolved again, and none holds
/// the commas or colons overlayfs's options would split on.
pub fn overlay_options(lower: &Path, upper: &Path, work: &Path) -> String {
    format!(
        "lowerdir={},upperdir={},workdir={},userxattr",
        lower.display(),
        upper.display(),
        work.display()
    )
}

/// Mounts the copy-on-write workspace (see the module's documentation):
/// each layer opened first (a directory, no symlink followed at its end),
/// then the overlay on the workspace's path.
fn mount_cow(cow: &CowMount) -> std::io::Result<()> {
    use hako_sys::rustix::fs::{open, Mode, OFlags};
    let layer = |what: &str, path: &Path| {
        open(
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            std::io::Error::new(
                std::io::Error::from(e).kind(),
                format!("the {what} {}: {e}", path.display()),
            )
        })
    };
    let lower = layer("workspace", &cow.workspace)?;
    let upper = layer("upper layer", &cow.upper)?;
    let work = layer("work directory", &cow.work)?;
    let options = overlay_options(
        &mount::fd_path(std::os::fd::AsFd::as_fd(&lower)),
        &mount::fd_path(std::os::fd::AsFd::as_fd(&upper)),
        &mount::fd_path(std::os::fd::AsFd::as_fd(&work)),
    );
    mount::mount(
        Some(Path::new("overlay")),
        &cow.workspace,
        Some("overlay"),
        mount::MS_NOSUID | mount::MS_NODEV,
        Some(&options),
    )
}

/// Mounts the plan's copy-on-write workspace and binds in a new mount
/// namespace of this process. Any failure stops here, before anything is
/// mounted where it should not be: they are made only once the namespace
/// is new and propagates nothing back to the host's.
fn mount_view(plan: &Plan) -> Result<(), String> {
    let bind = |e: std::io::Error| format!("cannot bind the root view: {e}");
    hako_sys::ns::unshare(hako_sys::ns::CLONE_NEWNS).map_err(bind)?;
    mount::mount(
        None,
        Path::new("/"),
        None,
        mount::MS_REC | mount::MS_PRIVATE,
        None,
    )
    .map_err(bind)?;
    if let Some(cow) = &plan.cow {
        mount_cow(cow).map_err(|e| {
            format!(
                "cannot mount the copy-on-write workspace (overlayfs over {}): {e}",
                cow.workspace.display()
            )
        })?;
    }
    bind_view(plan).map_err(bind)
}

/// Binds the plan's host directories into the root view, read-only.
fn bind_view(plan: &Plan) -> std::io::Result<()> {
    for (source, inside) in &plan.binds {
        let at = in_view(&plan.root, inside);
        mount::mount(
            Some(source),
            &at,
            None,
            mount::MS_BIND | mount::MS_REC,
            None,
        )?;
        mount::remount_readonly(&at, mount::MS_NOSUID | mount::MS_NODEV, Reach::Subtree)?;
    }
    Ok(())
}

/// Forks the cleaner of `bundle` (see the module's documentation); the
/// parent returns at once.
fn spawn_cleaner(bundle: &Path) -> std::io::Result<()> {
    let proof = hako_sys::ns::single_threaded()?;
    let parent = std::process::id();
    match hako_sys::ns::fork_single_threaded(&proof)? {
        hako_sys::ns::Forked::Parent(_) => Ok(()),
        hako_sys::ns::Forked::Child => {
            clean_after(parent, bundle);
            hako_sys::spawn::exit_now(GuestExit::Success.into())
        }
    }
}

/// The cleaner: waits for `parent` to exit, then removes `bundle`.
fn clean_after(parent: u32, bundle: &Path) {
    use hako_sys::rustix::event::{poll, PollFd, PollFlags};
    use hako_sys::rustix::process::{getppid, pidfd_open, Pid, PidfdFlags};
    // Nothing of the sandbox's stdio is held, and a signal meant for the
    // client's process group does not stop the removal.
    if hako_sys::stdio_to_null().is_err() || hako_sys::signal::block_terminating_signals().is_err()
    {
        return;
    }
    let Some(pid) = i32::try_from(parent).ok().and_then(Pid::from_raw) else {
        return;
    };
    let me = std::process::id();
    let line = owner_line(me, hako_sys::proc::start_time(me).unwrap_or(0));
    // Not created: a directory without an owner file (written before
    // runsc runs) is no bundle, and is left alone.
    let appended = std::fs::OpenOptions::new()
        .append(true)
        .open(bundle.join("owner"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if appended.is_err() {
        return;
    }
    // The descriptor names the parent for sure only while it is still
    // this process's parent (had it exited, this process would have been
    // adopted, and the pid could be another's).
    if let Ok(pidfd) = pidfd_open(pid, PidfdFlags::empty()) {
        if getppid() == Some(pid) {
            let mut fds = [PollFd::new(&pidfd, PollFlags::IN)];
            while let Err(hako_sys::rustix::io::Errno::INTR) = poll(&mut fds, None) {}
        }
    }
    let _ = std::fs::remove_dir_all(bundle);
}

/// Runs the mode: returns only on failure (its exit code), having said
/// why on stderr.
pub fn main(args: &[OsString]) -> GuestExit {
    if args.first().and_then(|a| a.to_str()) == Some(STAT_PROBE) {
        println!("{}", stat_probe());
        return GuestExit::Success;
    }
    let plan = match parse(args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("hako-guest {FLAG}: {e}");
            return GuestExit::Handshake;
        }
    };
    if let Some(bundle) = &plan.remove {
        if let Err(e) = spawn_cleaner(bundle) {
            eprintln!("hako-guest {FLAG}: cannot start the bundle's cleaner: {e}");
            return GuestExit::SetUp;
        }
    }
    if let Err(e) = mount_view(&plan) {
        eprintln!("hako-guest {FLAG}: {e}");
        return GuestExit::SetUp;
    }
    let err = std::process::Command::new(&plan.program[0])
        .args(&plan.program[1..])
        .exec();
    eprintln!(
        "hako-guest {FLAG}: cannot run {}: {err}",
        Path::new(&plan.program[0]).display()
    );
    GuestExit::Exec
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    #[test]
    fn parses_binds_and_the_program() {
        let plan = parse(&args(&[
            "/b/rootfs",
            "--bind",
            "/usr",
            "/usr",
            "--bind",
            "/g",
            "/.hako-guest",
            "--",
            "runsc",
            "--root",
            "/s",
            "run",
        ]))
        .unwrap();
        assert_eq!(plan.root, PathBuf::from("/b/rootfs"));
        assert_eq!(
            plan.binds,
            vec![
                ("/usr".into(), "/usr".into()),
                ("/g".into(), "/.hako-guest".into())
            ]
        );
        assert_eq!(plan.program, args(&["runsc", "--root", "/s", "run"]));
        assert_eq!(
            in_view(&plan.root, &plan.binds[1].1),
            PathBuf::from("/b/rootfs/.hako-guest")
        );
    }

    #[test]
    fn parses_a_copy_on_write_workspace_and_names_its_layers_by_descriptor() {
        let plan = parse(&args(&[
            "/b/rootfs",
            "--cow",
            "/w",
            "/s/upper",
            "/s/work",
            "--remove",
            "/b",
            "--",
            "runsc",
        ]))
        .unwrap();
        assert_eq!(
            plan.cow,
            Some(CowMount {
                workspace: "/w".into(),
                upper: "/s/upper".into(),
                work: "/s/work".into(),
            })
        );
        assert_eq!(plan.remove, Some(PathBuf::from("/b")));
        // The same options as the linux backend's overlay: user xattrs,
        // so no redirect or metacopy is made, and the layers by their
        // descriptors' paths.
        assert_eq!(
            overlay_options(
                Path::new("/proc/self/fd/3"),
                Path::new("/proc/self/fd/4"),
                Path::new("/proc/self/fd/5")
            ),
            "lowerdir=/proc/self/fd/3,upperdir=/proc/self/fd/4,workdir=/proc/self/fd/5,userxattr"
        );
        assert_eq!(parse(&args(&["/r", "--", "x"])).unwrap().cow, None);
    }

    #[test]
    fn the_stat_probe_s_line_reads_back_and_here_both_calls_succeed() {
        // The host's kernel takes AT_NO_AUTOMOUNT for both calls.
        let line = stat_probe();
        assert_eq!(parse_stat_probe(&line), Some((0, 0)), "{line}");
        assert_eq!(
            parse_stat_probe("noise\n--stat-probe statx=22 newfstatat=22\n"),
            Some((22, 22))
        );
        for bad in [
            "",
            "--stat-probe",
            "--stat-probe statx=22",
            "--stat-probe newfstatat=22 statx=0",
            "--stat-probe statx=x newfstatat=0",
            "stat-probe statx=0 newfstatat=0",
        ] {
            assert_eq!(parse_stat_probe(bad), None, "{bad}");
        }
    }

    #[test]
    fn refuses_a_bind_that_climbs_out_of_the_view_or_a_missing_program() {
        for bad in [
            &["/r", "--bind", "/usr", "/../etc", "--", "x"][..],
            &["/r", "--bind", "/usr", "usr", "--", "x"],
            &["/r", "--bind", "usr", "/usr", "--", "x"],
            &["/r", "--bind", "/usr", "/usr"],
            &["/r", "--"],
            &["r", "--", "x"],
            &["/r", "--bindx", "--", "x"],
            &["/r", "--remove", "b", "--", "x"],
            &["/r", "--remove"],
            &["/r", "--cow", "/w", "/u", "--", "x"],
            &["/r", "--cow", "/w", "u", "/k", "--", "x"],
            &["/r", "--cow", "w", "/u", "/k", "--", "x"],
            &[],
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad:?}");
        }
    }
}
