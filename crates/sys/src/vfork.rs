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

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

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
    /// Make stdin (a terminal) the controlling terminal of the new session.
    pub controlling_tty: bool,
    /// Set last, just before exec (see [`crate::confine::apply_rlimits`]).
    pub rlimits: &'a [crate::confine::Rlimit],
}

/// A stack for the child, made once and used by every spawn of a process:
/// mapped with a guard page below it, so an overflow faults instead of
/// writing over the parent's memory.
pub struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; nothing about it is
// tied to the thread that made it.
unsafe impl Send for ChildStack {}

/// The stack's size, guard page included: the child's work is a few system
/// calls and the caller's hook.
const CHILD_STACK: usize = 256 << 10;
const PAGE: usize = 4096;

impl ChildStack {
    /// Maps the stack.
    pub fn new() -> io::Result<ChildStack> {
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing touches no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHILD_STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack {
            base,
            len: CHILD_STACK,
        };
        // SAFETY: the lowest page of the mapping just made is ours to
        // protect.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        let top = self.base as usize + self.len;
        (top & !15) as *mut libc::c_void
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`, which nothing
        // uses any more (a spawn borrows the stack only while the child
        // shares it, and the child is gone or has exec'd when spawn returns).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

impl std::fmt::Debug for ChildStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildStack")
            .field("len", &self.len)
            .finish()
    }
}

/// Everything the child reads, prepared by the parent, and where the child
/// writes why it failed.
struct ChildArgs<'a> {
    stdio: [RawFd; 3],
    cwd_fd: Option<RawFd>,
    cwd_path: Option<CString>,
    fd3: Option<RawFd>,
    new_session: bool,
    parent_death_kill: bool,
    controlling_tty: bool,
    rlimits: &'a [crate::confine::Rlimit],
    /// The paths to try, in order.
    candidates: Vec<CString>,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// `/bin/sh`, a slot for the script's path, then the arguments: for a
    /// candidate that is not a binary (`ENOEXEC`), as `execvp` does.
    sh_argv: Vec<*const libc::c_char>,
    /// Written by the child: the failed step, and its errno (0: none).
    failed_step: SpawnStep,
    errno: i32,
}

/// `execvp`'s default search path when the environment has no `PATH`.
const DEFAULT_PATH: &[u8] = b"/bin:/usr/bin";

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument, variable or path contains a NUL byte",
        )
    })
}

/// The paths `execvp` would try for `program` with `path` as `PATH`.
fn candidates(program: &[u8], path: Option<&[u8]>) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    if program.contains(&b'/') {
        return Ok(vec![cstring(program)?]);
    }
    let path = path.unwrap_or(DEFAULT_PATH);
    let mut out = Vec::new();
    for dir in path.split(|&b| b == b':') {
        // An empty entry is the working directory.
        let full = if dir.is_empty() {
            program.to_vec()
        } else {
            let mut full = dir.to_vec();
            if !full.ends_with(b"/") {
                full.push(b'/');
            }
            full.extend_from_slice(program);
            full
        };
        out.push(cstring(&full)?);
    }
    Ok(out)
}

/// Starts `spec` with `clone(CLONE_VM | CLONE_VFORK)` on `stack` and
/// returns the child's pid once it has exec'd; the caller reaps it.
///
/// Descriptors given in `spec` must not be 0, 1 or 2 unless in their own
/// place (and then they are inherited as they are).
pub fn spawn(spec: SpawnSpec<'_>, stack: &mut ChildStack) -> Result<i32, SpawnError> {
    let prepare = |error| SpawnError {
        step: SpawnStep::Prepare,
        error,
    };
    let (program, _) = spec.argv.split_first().ok_or_else(|| {
        prepare(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the argument vector is empty",
        ))
    })?;
    // Every string the child needs, made here: the child allocates nothing.
    let args: Vec<CString> = spec
        .argv
        .iter()
        .map(|a| cstring(a.as_bytes()))
        .collect::<io::Result<_>>()
        .map_err(prepare)?;
    // One entry per name, the last value given winning (as
    // `std::process::Command::env` does); a name with `=` in it would set
    // another variable, and is refused.
    let mut merged: Vec<(&str, &str)> = Vec::with_capacity(spec.env.len());
    let mut at: std::collections::HashMap<&str, usize> =
        std::collections::HashMap::with_capacity(spec.env.len());
    for (k, v) in spec.env {
        if k.is_empty() || k.contains('=') {
            return Err(prepare(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{k:?} is not a valid environment variable name"),
            )));
        }
        match at.get(k.as_str()) {
            Some(&i) => merged[i].1 = v,
            None => {
                at.insert(k, merged.len());
                merged.push((k, v));
            }
        }
    }
    let env: Vec<CString> = merged
        .iter()
        .map(|(k, v)| cstring(format!("{k}={v}").as_bytes()))
        .collect::<io::Result<_>>()
        .map_err(prepare)?;
    let path = merged
        .iter()
        .find(|(k, _)| *k == "PATH")
        .map(|(_, v)| v.as_bytes());
    let candidates = candidates(program.as_bytes(), path).map_err(|error| SpawnError {
        step: SpawnStep::Exec,
        error,
    })?;
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let mut sh_argv: Vec<*const libc::c_char> = vec![SH.as_ptr(), std::ptr::null()];
    sh_argv.extend(args.iter().skip(1).map(|a| a.as_ptr()));
    sh_argv.push(std::ptr::null());
    let (cwd_fd, cwd_path) = match spec.cwd {
        None => (None, None),
        Some(SpawnCwd::Fd(fd)) => (Some(fd.as_raw_fd()), None),
        Some(SpawnCwd::Path(p)) => (
            None,
            Some(cstring(p.as_os_str().as_bytes()).map_err(prepare)?),
        ),
    };
    let stdio = spec.stdio.map(|fd| fd.as_raw_fd());
    let fd3 = spec.fd3.map(|fd| fd.as_raw_fd());
    // The child places stdio first, then descriptor 3: a source among the
    // targets would be overwritten before it is used.
    let clash = stdio
        .iter()
        .enumerate()
        .any(|(i, &fd)| fd < 3 && fd != i as RawFd)
        || fd3.is_some_and(|fd| fd < 3)
        || cwd_fd.is_some_and(|fd| fd < 3);
    if clash {
        return Err(prepare(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a descriptor to pass sits where another must go",
        )));
    }
    let mut child = ChildArgs {
        stdio,
        cwd_fd,
        cwd_path,
        fd3,
        new_session: spec.new_session,
        parent_death_kill: spec.parent_death_kill,
        controlling_tty: spec.controlling_tty,
        rlimits: spec.rlimits,
        candidates,
        argv,
        envp,
        sh_argv,
        failed_step: SpawnStep::Exec,
        errno: 0,
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

const SH: &CStr = c"/bin/sh";

/// In the child: records the failed step and errno, then exits.
fn fail(args: &mut ChildArgs<'_>, step: SpawnStep, errno: i32) -> ! {
    args.failed_step = step;
    args.errno = if errno == 0 { libc::EIO } else { errno };
    // SAFETY: _exit ends the child at once, running nothing of the
    // parent's (no atexit handler, no buffer flush on shared memory).
    unsafe { libc::_exit(127) }
}

fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` the parent passed to clone, alive
    // and untouched by the suspended parent until this child execs or
    // exits.
    let args = unsafe { &mut *arg.cast::<ChildArgs<'_>>() };
    child_setup_and_exec(args)
}

fn child_setup_and_exec(args: &mut ChildArgs<'_>) -> ! {
    // SAFETY: every call below is a plain system call on integers, on
    // memory prepared by the parent, or on locals; nothing allocates.
    unsafe {
        // Stdio, then descriptor 3 (sources were checked not to sit on a
        // target). dup2 clears close-on-exec on the copy; a descriptor
        // already in place keeps its flag, so clear it.
        let stdio = args.stdio;
        for (target, fd) in stdio.into_iter().enumerate() {
            let target = target as RawFd;
            let ok = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0) == 0
            } else {
                libc::dup2(fd, target) == target
            };
            if !ok {
                fail(args, SpawnStep::Descriptors, last_errno());
            }
        }
        // Signals: the parent's handlers go (they would run on its memory),
        // SIGPIPE gets its default back (as `std::process::Command` does),
        // then nothing stays blocked.
        for sig in 1..=libc::SIGRTMAX() {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                continue;
            }
            let handled = old.sa_sigaction != libc::SIG_DFL && old.sa_sigaction != libc::SIG_IGN;
            if handled || sig == libc::SIGPIPE {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                if libc::sigaction(sig, &dfl, std::ptr::null_mut()) != 0 {
                    fail(args, SpawnStep::Signals, last_errno());
                }
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        if libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()) != 0 {
            fail(args, SpawnStep::Signals, last_errno());
        }
        if args.parent_death_kill && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            fail(args, SpawnStep::ParentDeath, last_errno());
        }
        if args.new_session && libc::setsid() == -1 {
            fail(args, SpawnStep::Session, last_errno());
        }
        if args.controlling_tty {
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                fail(args, SpawnStep::Terminal, last_errno());
            }
            // Linux makes the new session's group the terminal's foreground
            // group with TIOCSCTTY; gVisor does not, and Ctrl-C would then
            // signal no one. Say it explicitly.
            if libc::tcsetpgrp(0, libc::getpgrp()) != 0 {
                fail(args, SpawnStep::Terminal, last_errno());
            }
        }
        if let Some(fd) = args.cwd_fd {
            if libc::fchdir(fd) != 0 {
                fail(args, SpawnStep::Cwd, last_errno());
            }
        }
        if let Some(path) = args.cwd_path.as_ref().map(|p| p.as_ptr()) {
            if libc::chdir(path) != 0 {
                fail(args, SpawnStep::Cwd, last_errno());
            }
        }
        if let Some(fd) = args.fd3 {
            let ok = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0) == 0
            } else {
                libc::dup2(fd, 3) == 3
            };
            if !ok {
                fail(args, SpawnStep::Descriptors, last_errno());
            }
        }
    }
    let first = if args.fd3.is_some() { 4 } else { 3 };
    if let Err(err) = crate::spawn::cloexec_fds_from(first) {
        fail(
            args,
            SpawnStep::Descriptors,
            err.raw_os_error().unwrap_or(libc::EIO),
        );
    }
    // No allocation on failure either: the error's errno is passed on.
    if let Err(err) = crate::confine::apply_rlimits(args.rlimits) {
        let errno = match err {
            crate::confine::ConfineError::Rlimit { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EINVAL)
            }
            _ => libc::EINVAL,
        };
        fail(args, SpawnStep::Limits, errno);
    }
    // As `execvp`: each candidate in turn; one that exists but is not a
    // binary runs under /bin/sh; EACCES is remembered and the search goes
    // on; any error but "not there" ends it.
    let mut eacces = false;
    let mut last = libc::ENOENT;
    for i in 0..args.candidates.len() {
        let path = args.candidates[i].as_ptr();
        // SAFETY: NUL-terminated path and null-terminated vectors of
        // NUL-terminated strings, all prepared by the parent and alive.
        unsafe { libc::execve(path, args.argv.as_ptr(), args.envp.as_ptr()) };
        let errno = last_errno();
        match errno {
            libc::ENOEXEC => {
                args.sh_argv[1] = path;
                // SAFETY: as above; the slot just filled points at a live
                // candidate.
                unsafe { libc::execve(SH.as_ptr(), args.sh_argv.as_ptr(), args.envp.as_ptr()) };
                fail(args, SpawnStep::Exec, libc::ENOEXEC);
            }
            libc::EACCES => {
                eacces = true;
                last = errno;
            }
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {
                last = errno;
            }
            _ => fail(args, SpawnStep::Exec, errno),
        }
    }
    fail(
        args,
        SpawnStep::Exec,
        if eacces { libc::EACCES } else { last },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read as _;
    use std::os::fd::{AsFd, OwnedFd};

    #[test]
    fn a_name_without_a_slash_is_searched_for_in_each_path_entry_in_order() {
        let got = candidates(b"ls", Some(b"/a:/b/::/c")).unwrap_or_else(|e| panic!("{e}"));
        let got: Vec<&[u8]> = got.iter().map(|c| c.as_bytes()).collect();
        assert_eq!(got, [&b"/a/ls"[..], b"/b/ls", b"ls", b"/c/ls"]);
        let default = candidates(b"ls", None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(default.len(), 2);
        let direct = candidates(b"./x", Some(b"/a")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(direct[0].as_bytes(), b"./x");
        assert!(candidates(b"", None).is_err());
        assert!(candidates(b"a\0b", None).is_err());
    }

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
                env: &r.env,
                stdio: [null.as_fd(), out_w.as_fd(), out_w.as_fd()],
                cwd: r.cwd.as_deref().map(SpawnCwd::Path),
                fd3: r.fd3.as_ref().map(AsFd::as_fd),
                new_session: true,
                parent_death_kill: true,
                controlling_tty: false,
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
                env: &[],
                stdio: [stdin, stdin, stdin],
                cwd: None,
                fd3: None,
                new_session: false,
                parent_death_kill: false,
                controlling_tty: false,
                rlimits: &[],
            },
            &mut stack,
        )
        .err()
        .unwrap_or_else(|| panic!("spawned with clashing descriptors"));
        assert_eq!(err.step, SpawnStep::Prepare);
    }
}
