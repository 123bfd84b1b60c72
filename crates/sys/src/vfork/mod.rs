//! Starting a program the way `posix_spawn` does: `clone(CLONE_VM |
//! CLONE_VFORK)`, so that no page table is copied and none torn down again
//! at `exec`, with the setup a supervisor needs between the two (stdio,
//! session, controlling terminal, working directory, descriptor 3, every
//! other descriptor closed at exec, a last confinement step).
//!
//! The child shares the parent's memory until it execs or exits, and the
//! parent is suspended meanwhile: the child touches nothing but what the
//! parent prepared for it (paths, argument and environment vectors, all
//! allocated before the clone) and its own stack, and it reports a failure
//! by writing the step and `errno` where the parent reads them once it
//! resumes. Other threads of the parent keep running meanwhile, which is
//! why the child runs no code of the caller's, takes no lock and allocates
//! nothing.
//!
//! `prepare` builds what the child reads, `stack` its stack, `child` what
//! it runs; [`spawn`] here clones and reads back how it ended.

use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

mod child;
mod prepare;
mod stack;

use child::child_main;
use prepare::{child_args, ChildArgs};
pub use stack::ChildStack;

/// Where the child starts.
#[derive(Debug, Clone, Copy)]
pub enum SpawnCwd<'a> {
    /// This directory, by descriptor.
    Fd(BorrowedFd<'a>),
    /// This path.
    Path(&'a Path),
}

/// The step of starting a program that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpawnStep {
    /// Preparing in the parent (a NUL byte in an argument, no memory).
    Prepare,
    /// Placing stdio and descriptor 3.
    Descriptors,
    /// Signal dispositions and mask.
    Signals,
    /// The parent-death signal.
    ParentDeath,
    /// A new session.
    Session,
    /// Making stdin the controlling terminal.
    Terminal,
    /// Changing into the working directory.
    Cwd,
    /// The program's rlimits.
    Limits,
    /// `execve` of every candidate.
    Exec,
}

impl SpawnStep {
    /// What was being done, for a message.
    pub fn describe(self) -> &'static str {
        match self {
            SpawnStep::Prepare => "prepare the command",
            SpawnStep::Descriptors => "set up the command's descriptors",
            SpawnStep::Signals => "reset the command's signals",
            SpawnStep::ParentDeath => "set the command's parent-death signal",
            SpawnStep::Session => "start the command's session",
            SpawnStep::Terminal => "give the command its terminal",
            SpawnStep::Cwd => "change into the working directory",
            SpawnStep::Limits => "set the command's limits",
            SpawnStep::Exec => "execute the command",
        }
    }
}

/// Why a program could not be started.
#[derive(Debug)]
pub struct SpawnError {
    /// The step that failed.
    pub step: SpawnStep,
    /// Its error.
    pub error: io::Error,
}

impl std::fmt::Display for SpawnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.step {
            SpawnStep::Exec => write!(f, "{}", self.error),
            step => write!(f, "cannot {}: {}", step.describe(), self.error),
        }
    }
}

impl std::error::Error for SpawnError {}

/// What to start, and how.
pub struct SpawnSpec<'a> {
    /// The program (searched for in the `PATH` of `env` when it has no
    /// slash, as `execvp` does) and its arguments.
    pub argv: &'a [String],
    /// The file to execute when it is not `argv[0]`, which is then only
    /// the name the program sees (a multi-call executable started under
    /// another of its names). Not searched for in `PATH`.
    pub program: Option<&'a std::path::Path>,
    /// The whole environment of the program.
    pub env: &'a [(String, String)],
    /// Its stdin, stdout and stderr.
    pub stdio: [BorrowedFd<'a>; 3],
    /// Its working directory (the parent's when `None`).
    pub cwd: Option<SpawnCwd<'a>>,
    /// Given to the program as its descriptor 3.
    pub fd3: Option<BorrowedFd<'a>>,
    /// Start a new session (and process group).
    pub new_session: bool,
    /// SIGKILL the child when the parent thread ends.
    pub parent_death_kill: bool,
    /// Start a process group of its own in the caller's session and make
    /// it the foreground group of stdin, the caller's controlling terminal
    /// (the caller leads the session: see `hako-guest`'s supervisor). Not
    /// with `new_session`.
    pub foreground_group: bool,
    /// Set last, just before exec (see [`crate::confine::apply_rlimits`]).
    pub rlimits: &'a [crate::confine::Rlimit],
}

/// Starts `spec` with `clone(CLONE_VM | CLONE_VFORK)` on `stack` and
/// returns the child's pid once it has exec'd; the caller reaps it.
///
/// Descriptors given in `spec` must not be 0, 1 or 2 unless in their own
/// place (and then they are inherited as they are).
pub fn spawn(spec: SpawnSpec<'_>, stack: &mut ChildStack) -> Result<i32, SpawnError> {
    let mut child = child_args(&spec)?;
    let prepare = |error| SpawnError {
        step: SpawnStep::Prepare,
        error,
    };

    // No handler of the parent's may run in the child (it would run on
    // shared memory): block every signal around the clone; the child resets
    // the dispositions, then empties its mask.
    // SAFETY: sigset_t is plain data; sigfillset fills it.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `all` is a valid sigset_t to fill.
    unsafe { libc::sigfillset(&mut all) };
    // SAFETY: valid sigset pointers; changes only this thread's mask.
    if unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) } != 0 {
        return Err(prepare(io::Error::last_os_error()));
    }
    // SAFETY: the child runs `child_main` on `stack`, which is borrowed
    // mutably here and so used by nothing else, and touches only `child`;
    // this thread is suspended (CLONE_VFORK) until the child execs or
    // exits, so nothing else touches `child` meanwhile, and the child takes
    // no lock another thread could hold and allocates nothing. `child`
    // outlives the clone: it is a local read again below.
    let pid = unsafe {
        libc::clone(
            child_main,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut child as *mut ChildArgs<'_>).cast::<libc::c_void>(),
        )
    };
    let clone_error = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if pid < 0 {
        return Err(prepare(clone_error));
    }
    // The child has exec'd or exited: `child` is ours again. Read what it
    // wrote through a volatile load (the compiler cannot see the write).
    // SAFETY: both fields are plain data (an integer, a fieldless enum) of a
    // live local, only ever written with valid values.
    let errno = unsafe { std::ptr::read_volatile(&child.errno) };
    // SAFETY: as above.
    let step = unsafe { std::ptr::read_volatile(&child.failed_step) };
    if errno != 0 {
        // It exited with 127: reap it now, nobody else will.
        let mut status = 0;
        // SAFETY: waiting for our own child, into a local.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(SpawnError {
            step,
            error: io::Error::from_raw_os_error(errno),
        });
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::os::fd::{AsFd, OwnedFd};

    struct Run {
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<std::path::PathBuf>,
        fd3: Option<OwnedFd>,
        rlimits: Vec<crate::confine::Rlimit>,
    }

    fn run(argv: &[&str]) -> Run {
        Run {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            env: vec![("PATH".into(), "/usr/bin:/bin".into())],
            cwd: None,
            fd3: None,
            rlimits: Vec::new(),
        }
    }

    /// Spawns, then returns what the child wrote on stdout and stderr and
    /// its exit code.
    fn go(r: Run) -> Result<(String, i32), SpawnError> {
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (out_r, out_w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut stack = ChildStack::new().unwrap_or_else(|e| panic!("{e}"));
        let spawned = spawn(
            SpawnSpec {
                argv: &r.argv,
                program: None,
                env: &r.env,
                stdio: [null.as_fd(), out_w.as_fd(), out_w.as_fd()],
                cwd: r.cwd.as_deref().map(SpawnCwd::Path),
                fd3: r.fd3.as_ref().map(AsFd::as_fd),
                new_session: true,
                parent_death_kill: true,
                foreground_group: false,
                rlimits: &r.rlimits,
            },
            &mut stack,
        );
        drop(out_w);
        let pid = spawned?;
        let mut text = String::new();
        std::fs::File::from(out_r)
            .read_to_string(&mut text)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut status = 0;
        // SAFETY: waiting for the child just spawned, into a local.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        Ok((text, libc::WEXITSTATUS(status)))
    }

    #[test]
    fn the_child_gets_its_stdio_environment_cwd_and_descriptor_3_and_nothing_else() {
        let dir = std::env::temp_dir();
        // A descriptor of the parent's without close-on-exec, numbered high
        // (where nothing the child is given could sit).
        // SAFETY: F_DUPFD of stdin returns a new descriptor owned here.
        let leaky_no = unsafe { libc::fcntl(0, libc::F_DUPFD, 200) };
        assert!(leaky_no >= 200, "{}", io::Error::last_os_error());
        // SAFETY: just made, owned by nothing else.
        let leaky = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(leaky_no) };
        let (r3, w3) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .unwrap_or_else(|e| panic!("{e}"));
        rustix::io::write(&w3, b"from-fd3").unwrap_or_else(|e| panic!("{e}"));
        drop(w3);
        let script = format!(
            "echo \"$X\"; pwd; head -c 8 <&3; echo; [ -e /proc/self/fd/{leaky_no} ] && echo leaked; [ -e /proc/self/fd/4 ] && echo four; echo sid=$(cut -d' ' -f6 /proc/self/stat) pid=$$"
        );
        let mut r = run(&["sh", "-c", &script]);
        r.env.push(("X".into(), "a value".into()));
        r.cwd = Some(dir.clone());
        r.fd3 = Some(r3);
        let (text, code) = go(r).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(code, 0, "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "a value");
        assert_eq!(
            std::fs::canonicalize(lines[1]).ok(),
            std::fs::canonicalize(&dir).ok()
        );
        assert_eq!(lines[2], "from-fd3");
        assert!(!text.contains("leaked"), "{text}");
        assert!(!text.contains("four"), "{text}");
        // A session of its own: the shell (same process) leads it.
        let ids = lines[3];
        let sid = ids.split(' ').next().and_then(|s| s.strip_prefix("sid="));
        let pid = ids.split(' ').nth(1).and_then(|s| s.strip_prefix("pid="));
        assert_eq!(sid, pid, "{ids}");
        drop(leaky);
    }

    #[test]
    fn blocked_and_ignored_signals_of_the_parent_do_not_reach_the_child() {
        // SAFETY: sigset_t is plain data, filled and used on this thread.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        }
        let (text, code) = go(run(&[
            "sh",
            "-c",
            "grep -E '^Sig(Blk|Ign)' /proc/self/status",
        ]))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(code, 0, "{text}");
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| u64::from_str_radix(v.trim(), 16).unwrap_or(u64::MAX))
                .unwrap_or(u64::MAX)
        };
        assert_eq!(field("SigBlk:"), 0, "{text}");
        let pipe_bit = 1u64 << (libc::SIGPIPE - 1);
        assert_eq!(field("SigIgn:") & pipe_bit, 0, "{text}");
    }

    #[test]
    fn the_last_value_of_a_variable_wins_and_a_name_with_an_equals_sign_is_refused() {
        let mut r = run(&["sh", "-c", "echo \"$X\"; env | grep -c '^X='"]);
        r.env.push(("X".into(), "first".into()));
        r.env.push(("X".into(), "last".into()));
        let (text, code) = go(r).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((text.as_str(), code), ("last\n1\n", 0));
        let mut r = run(&["true"]);
        r.env.push(("PATH=/evil:x".into(), "y".into()));
        let err = go(r)
            .err()
            .unwrap_or_else(|| panic!("ran with a name holding '='"));
        assert_eq!(err.step, SpawnStep::Prepare);
    }

    #[test]
    fn a_missing_program_fails_at_exec_with_enoent() {
        let err = go(run(&["no-such-program-anywhere"])).err();
        let err = err.unwrap_or_else(|| panic!("a missing program ran"));
        assert_eq!(err.step, SpawnStep::Exec);
        assert_eq!(err.error.raw_os_error(), Some(libc::ENOENT));
    }

    #[test]
    fn a_file_without_the_execute_bit_fails_with_eacces_and_one_without_a_shebang_runs_under_sh() {
        let dir = std::env::temp_dir().join(format!("hako-vfork-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let plain = dir.join("plain");
        std::fs::write(&plain, "echo from-script\n").unwrap_or_else(|e| panic!("{e}"));
        let path = plain.to_string_lossy().to_string();
        let err = go(run(&[&path]))
            .err()
            .unwrap_or_else(|| panic!("ran without +x"));
        assert_eq!(
            (err.step, err.error.raw_os_error()),
            (SpawnStep::Exec, Some(libc::EACCES))
        );
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        // Another test's child, forked while the file was open for writing,
        // may hold it open until it execs: "text file busy" for a moment.
        let mut tries = 0;
        let (text, code) = loop {
            match go(run(&[&path])) {
                Err(e) if e.error.raw_os_error() == Some(libc::ETXTBSY) && tries < 200 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                other => break other.unwrap_or_else(|e| panic!("{e}")),
            }
        };
        assert_eq!((text.as_str(), code), ("from-script\n", 0));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn limits_are_set_before_exec_and_one_that_cannot_be_stops_the_command() {
        use crate::confine::{Resource, Rlimit};
        let mut r = run(&["sh", "-c", "ulimit -n"]);
        r.rlimits = vec![Rlimit::new(Resource::Nofile, 77)];
        let (text, code) = go(r).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((text.as_str(), code), ("77\n", 0));
        let marker = std::env::temp_dir().join(format!("hako-vfork-ran-{}", std::process::id()));
        let mut r = run(&["touch", &marker.to_string_lossy()]);
        // A soft limit above its hard one cannot be set.
        r.rlimits = vec![Rlimit {
            resource: Resource::Nofile,
            soft: 100,
            hard: 10,
        }];
        let err = go(r)
            .err()
            .unwrap_or_else(|| panic!("ran although its limits failed"));
        assert_eq!(
            (err.step, err.error.raw_os_error()),
            (SpawnStep::Limits, Some(libc::EINVAL))
        );
        assert!(!marker.exists(), "the command ran");
        assert!(
            err.to_string()
                .starts_with("cannot set the command's limits"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_working_directory_is_reported_as_such() {
        let mut r = run(&["true"]);
        r.cwd = Some("/no/such/directory".into());
        let err = go(r)
            .err()
            .unwrap_or_else(|| panic!("ran in a missing directory"));
        assert_eq!(
            (err.step, err.error.raw_os_error()),
            (SpawnStep::Cwd, Some(libc::ENOENT))
        );
    }

    #[test]
    fn descriptors_sitting_where_stdio_goes_are_refused_before_anything_starts() {
        let argv = vec!["true".to_string()];
        let mut stack = ChildStack::new().unwrap_or_else(|e| panic!("{e}"));
        let stdin = rustix::stdio::stdin();
        // stdout's source is descriptor 0, which stdin's placing overwrites.
        let err = spawn(
            SpawnSpec {
                argv: &argv,
                program: None,
                env: &[],
                stdio: [stdin, stdin, stdin],
                cwd: None,
                fd3: None,
                new_session: false,
                parent_death_kill: false,
                foreground_group: false,
                rlimits: &[],
            },
            &mut stack,
        )
        .err()
        .unwrap_or_else(|| panic!("spawned with clashing descriptors"));
        assert_eq!(err.step, SpawnStep::Prepare);
    }
}
