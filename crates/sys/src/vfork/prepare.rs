//! What the parent prepares before the clone: every string, vector and
//! descriptor number the child reads, so that the child allocates nothing.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;

use super::{SpawnCwd, SpawnError, SpawnSpec, SpawnStep};

/// Everything the child reads, prepared by the parent, and where the child
/// writes why it failed.
pub(super) struct ChildArgs<'a> {
    pub(super) stdio: [RawFd; 3],
    pub(super) cwd_fd: Option<RawFd>,
    pub(super) cwd_path: Option<CString>,
    pub(super) fd3: Option<RawFd>,
    pub(super) new_session: bool,
    pub(super) parent_death_kill: bool,
    pub(super) foreground_group: bool,
    pub(super) rlimits: &'a [crate::confine::Rlimit],
    /// The paths to try, in order.
    pub(super) candidates: Vec<CString>,
    pub(super) argv: Vec<*const libc::c_char>,
    pub(super) envp: Vec<*const libc::c_char>,
    /// `/bin/sh`, a slot for the script's path, then the arguments: for a
    /// candidate that is not a binary (`ENOEXEC`), as `execvp` does.
    pub(super) sh_argv: Vec<*const libc::c_char>,
    /// Written by the child: the failed step, and its errno (0: none).
    pub(super) failed_step: SpawnStep,
    pub(super) errno: i32,
    /// Own the strings `argv` and `envp` (and `sh_argv`) point into.
    _arg_strings: Vec<CString>,
    _env_strings: Vec<CString>,
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

/// The shell a candidate that is not a binary runs under.
pub(super) const SH: &CStr = c"/bin/sh";

/// Everything the child of `spec` needs, made here: the child allocates
/// nothing. Refuses (step `Prepare`) an empty argument vector, a NUL byte,
/// an environment name that is empty or holds `=`, and a descriptor that
/// sits where another must go; a program not found in any candidate is
/// left to the child's `execve`.
pub(super) fn child_args<'a>(spec: &SpawnSpec<'a>) -> Result<ChildArgs<'a>, SpawnError> {
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
    let candidates = match spec.program {
        Some(file) => vec![cstring(file.as_os_str().as_bytes()).map_err(prepare)?],
        None => candidates(program.as_bytes(), path).map_err(|error| SpawnError {
            step: SpawnStep::Exec,
            error,
        })?,
    };
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
    Ok(ChildArgs {
        stdio,
        cwd_fd,
        cwd_path,
        fd3,
        new_session: spec.new_session,
        parent_death_kill: spec.parent_death_kill,
        foreground_group: spec.foreground_group,
        rlimits: spec.rlimits,
        candidates,
        argv,
        envp,
        sh_argv,
        failed_step: SpawnStep::Exec,
        errno: 0,
        _arg_strings: args,
        _env_strings: env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

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

    /// The strings a null-terminated vector of C strings points at.
    fn strings(v: &[*const libc::c_char]) -> Vec<String> {
        assert_eq!(v.last(), Some(&std::ptr::null()), "not null-terminated");
        v[..v.len() - 1]
            .iter()
            .map(|&p| {
                assert!(!p.is_null());
                // SAFETY: every entry but the last points at a C string the
                // `ChildArgs` under test owns, alive for this call.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            })
            .collect()
    }

    #[test]
    fn the_child_gets_vectors_built_in_advance_with_the_last_value_of_each_variable() {
        let argv = vec!["prog".to_string(), "a b".to_string()];
        let env = vec![
            ("X".to_string(), "1".to_string()),
            ("PATH".to_string(), "/p".to_string()),
            ("X".to_string(), "2".to_string()),
        ];
        let stdin = rustix::stdio::stdin();
        let null = rustix::fs::open(
            "/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let spec = SpawnSpec {
            argv: &argv,
            program: None,
            env: &env,
            stdio: [stdin, null.as_fd(), null.as_fd()],
            cwd: Some(SpawnCwd::Path(std::path::Path::new("/tmp"))),
            fd3: None,
            new_session: true,
            parent_death_kill: false,
            foreground_group: false,
            rlimits: &[],
        };
        let child = child_args(&spec).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(strings(&child.argv), ["prog", "a b"]);
        assert_eq!(strings(&child.envp), ["X=2", "PATH=/p"]);
        // `/bin/sh`, the script's slot (filled by the child), the arguments.
        assert_eq!(child.sh_argv.len(), 4);
        assert_eq!(child.sh_argv[1], std::ptr::null());
        assert_eq!(strings(&child.sh_argv[2..]), ["a b"]);
        let paths: Vec<&[u8]> = child.candidates.iter().map(|c| c.as_bytes()).collect();
        assert_eq!(paths, [&b"/p/prog"[..]]);
        assert_eq!(child.cwd_path.as_deref(), Some(c"/tmp"));
        assert_eq!((child.errno, child.failed_step), (0, SpawnStep::Exec));
    }

    #[test]
    fn a_program_given_apart_is_executed_under_the_name_argv_gives() {
        let argv = vec!["hako-guest".to_string(), "--stdio".to_string()];
        let env = vec![("PATH".to_string(), "/p".to_string())];
        let stdin = rustix::stdio::stdin();
        let spec = SpawnSpec {
            argv: &argv,
            program: Some(std::path::Path::new("/opt/bin/hako")),
            env: &env,
            stdio: [stdin, rustix::stdio::stdout(), rustix::stdio::stderr()],
            cwd: None,
            fd3: None,
            new_session: false,
            parent_death_kill: false,
            foreground_group: false,
            rlimits: &[],
        };
        let child = child_args(&spec).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(strings(&child.argv), ["hako-guest", "--stdio"]);
        let paths: Vec<&[u8]> = child.candidates.iter().map(|c| c.as_bytes()).collect();
        assert_eq!(paths, [&b"/opt/bin/hako"[..]], "not searched for in PATH");
    }

    /// The step `child_args` refuses these at, or `None` if it accepts.
    fn refused_at(
        argv: &[&str],
        env: &[(&str, &str)],
        stdio: [std::os::fd::BorrowedFd<'_>; 3],
    ) -> Option<SpawnStep> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let spec = SpawnSpec {
            argv: &argv,
            program: None,
            env: &env,
            stdio,
            cwd: None,
            fd3: None,
            new_session: false,
            parent_death_kill: false,
            foreground_group: false,
            rlimits: &[],
        };
        child_args(&spec).err().map(|e| e.step)
    }

    #[test]
    fn what_the_child_could_not_use_is_refused_before_any_clone() {
        use rustix::stdio::{stderr, stdin, stdout};
        let own = [stdin(), stdout(), stderr()];
        assert_eq!(refused_at(&["true"], &[("X", "1")], own), None);
        assert_eq!(refused_at(&[], &[], own), Some(SpawnStep::Prepare));
        assert_eq!(refused_at(&["a\0b"], &[], own), Some(SpawnStep::Prepare));
        assert_eq!(
            refused_at(&["true"], &[("", "v")], own),
            Some(SpawnStep::Prepare)
        );
        assert_eq!(
            refused_at(&["true"], &[("A=B", "v")], own),
            Some(SpawnStep::Prepare)
        );
        assert_eq!(
            refused_at(&["true"], &[("X", "a\0b")], own),
            Some(SpawnStep::Prepare)
        );
        // stdout and stderr would come from descriptor 0, overwritten first.
        let clash = [stdin(), stdin(), stdin()];
        assert_eq!(refused_at(&["true"], &[], clash), Some(SpawnStep::Prepare));
        // A name found in no candidate is the child's to report (as ENOENT
        // from execve), but an empty one has no candidate at all.
        assert_eq!(refused_at(&["no-such-program"], &[], own), None);
        assert_eq!(refused_at(&[""], &[], own), Some(SpawnStep::Exec));
    }
}
