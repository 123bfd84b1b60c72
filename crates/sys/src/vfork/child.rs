//! The child, between the clone and `exec`: it shares the parent's memory,
//! so it runs only system calls on what the parent prepared, takes no lock
//! and allocates nothing; a failure is written back for the parent.

use std::io;
use std::os::fd::RawFd;

use super::prepare::{ChildArgs, SH};
use super::SpawnStep;

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

pub(super) extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
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
        // A group of its own, the terminal's foreground one: while every
        // signal is still blocked (since the clone), so that setting the
        // foreground from a background group raises no SIGTTOU (a blocked
        // SIGTTOU lets it through, on Linux and on gVisor).
        if args.foreground_group
            && (libc::setpgid(0, 0) != 0 || libc::tcsetpgrp(0, libc::getpid()) != 0)
        {
            fail(args, SpawnStep::Terminal, last_errno());
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
