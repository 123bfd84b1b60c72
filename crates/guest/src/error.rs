//! What can go wrong in the guest.
//!
//! Every failure of the guest is a [`GuestError`]: what failed, on what,
//! the error it failed with (kept as its [`source`](std::error::Error::source))
//! and, where there is one, a hint. Its message is what hako shows: it is
//! turned into a string only where it goes on the wire (a
//! [`FromGuest::Refused`](crate::proto::FromGuest::Refused) or
//! [`FromGuest::Failed`](crate::proto::FromGuest::Failed) frame, a
//! supervisor's [`RunReply::Refused`](crate::proto::RunReply::Refused)).

use std::borrow::Cow;
use std::path::PathBuf;

/// The error an operation failed with: an OS error, a confinement or
/// seccomp error, or another guest error (what a step of a larger one
/// failed with).
pub type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failure of the guest.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuestError {
    /// An operation failed: `op` is what the guest was doing, as a short
    /// phrase ("open signalfd": "cannot open signalfd: ...").
    #[error("cannot {op}: {source}")]
    Failed {
        /// What the guest was doing.
        op: &'static str,
        /// What it failed with.
        #[source]
        source: Source,
    },
    /// An operation on a path failed ("cannot mask /etc/shadow: ...").
    #[error("cannot {op} {}: {source}", path.display())]
    FailedOn {
        /// What the guest was doing.
        op: &'static str,
        /// What it was doing it on.
        path: PathBuf,
        /// What it failed with.
        #[source]
        source: Source,
    },
    /// An operation failed, and what may be done about it.
    #[error("cannot {op}: {source}; hint: {hint}")]
    FailedWithHint {
        /// What the guest was doing.
        op: &'static str,
        /// What it failed with.
        #[source]
        source: Source,
        /// What may be done about it.
        hint: Cow<'static, str>,
    },
    /// A loopback port of the sandbox's network could not be bound.
    #[error("cannot listen on 127.0.0.1:{port} inside the sandbox: {source}")]
    Listen {
        /// The port.
        port: u16,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// The sandbox's uid and gid could not be mapped into its user
    /// namespace.
    #[error("cannot map uid {uid} / gid {gid} into the user namespace: {source}")]
    MapIds {
        /// The uid inside.
        uid: u32,
        /// The gid inside.
        gid: u32,
        /// Why not.
        #[source]
        source: std::io::Error,
    },
    /// Something the sandbox requires is not there (Landlock, required but
    /// missing from the kernel).
    #[error("{requirement}; hint: {hint}")]
    Unmet {
        /// What is required and missing.
        requirement: &'static str,
        /// What may be done about it.
        hint: &'static str,
    },
    /// A sealed guest could not keep `CAP_SETPCAP` as its guard: the
    /// runtime did not give it.
    #[error("the guest cannot keep CAP_SETPCAP as its guard (the runtime did not give it): commands could reach the guest's descriptors")]
    GuardNotKept,
    /// A sealed guest could not empty its bounding set: the runtime did not
    /// give it `CAP_SETPCAP`.
    #[error("the bounding set could not be emptied (the guest was not given CAP_SETPCAP)")]
    BoundingSetNotEmptied,
    /// A sealed guest set its process limit but is not counted by it
    /// (gVisor's `pids` controller did not take it).
    #[error("the process limit was set but the guest is not in its group ({0}): the limit would not hold")]
    PidsNotJoined(String),
    /// `fork` (or `clone`) reported a pid of 0.
    #[error("fork returned pid 0")]
    ZeroPid,
    /// The zygote supervisors are forked from is gone (a command killed
    /// it) while commands run; it is replaced once none does (see
    /// `zygote`).
    #[error("the supervisors' zygote was killed from inside the sandbox; a new one starts once no command runs")]
    ZygoteGone,
    /// The zygote could not fork a supervisor (out of processes or
    /// descriptors); it stays, and a later command may find room.
    #[error("cannot fork a supervisor for the command: {source}")]
    NoSupervisor {
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The guest is not single-threaded, or cannot tell that it is (it
    /// forks, which only a single-threaded process may do safely).
    #[error("{0}")]
    NotSingleThreaded(#[source] std::io::Error),
    /// The handshake frame could not be read.
    #[error("bad handshake frame: {0}")]
    BadHandshake(#[source] std::io::Error),
    /// The first frame was not the handshake (`got`: what it was).
    #[error("expected the handshake, got {got}")]
    NoHandshake {
        /// The frame that came instead, as it prints for debugging.
        got: String,
    },
    /// The handshake asked for a protocol version this guest does not
    /// speak.
    #[error("protocol version {asked} is not supported; this guest speaks {speaks}")]
    Version {
        /// The version hako asked for.
        asked: u32,
        /// The version this guest speaks.
        speaks: u32,
    },
    /// The handshake asked for a seal and a `linux` sandbox at once.
    #[error("a seal is for a guest that serves where it is, not for a linux sandbox")]
    SealWithLinux,
    /// The handshake asked for a guest's own confinement and a `linux`
    /// sandbox or a seal at once.
    #[error(
        "a guest's own confinement (landlock) cannot be combined with a linux sandbox or a seal"
    )]
    ConfineWithOther,
    /// The handshake asked a guest reached over pipes for a `linux`
    /// sandbox.
    #[error("a linux sandbox is built only by a guest reached over a socket")]
    LinuxOverPipes,
    /// A request named an id that a command or session already has.
    #[error("id {id} is already in use")]
    IdInUse {
        /// The id.
        id: u64,
    },
    /// A command's argument vector is empty (or its program's name is).
    #[error("the argument vector is empty")]
    EmptyArgv,
    /// A session's shell's argument vector is empty (or its program's
    /// name is).
    #[error("the shell's argument vector is empty")]
    EmptyShell,
    /// A session's script contains a NUL byte.
    #[error("the script contains a NUL byte")]
    NulInScript,
    /// A working directory came as a descriptor where none is accepted
    /// (inside a `linux` sandbox, or over pipes).
    #[error("a working directory descriptor is not accepted here")]
    CwdFdNotAccepted,
    /// A request said its working directory came as a descriptor, and none
    /// did.
    #[error("no working directory descriptor came with the request")]
    CwdFdMissing,
    /// A working directory path is relative.
    #[error("working directory {} is not absolute", path.display())]
    CwdNotAbsolute {
        /// The path.
        path: PathBuf,
    },
    /// A request was for a session that is not open.
    #[error("session {session} is not open: {why}")]
    SessionNotOpen {
        /// The session's id.
        session: u64,
        /// Why not: never opened or closed, or how it ended.
        why: String,
    },
    /// A request was for a session that is running another command.
    #[error("session {session} is busy running command {running}")]
    SessionBusy {
        /// The session's id.
        session: u64,
        /// The command it runs.
        running: u64,
    },
    /// A supervisor was handed something that is not a job (a violation of
    /// the protocol between the guest and its supervisors).
    #[error("{what}{}", match source { Some(e) => format!(": {e}"), None => String::new() })]
    BadHandoff {
        /// What was wrong with it.
        what: &'static str,
        /// The error that showed it, if one did.
        #[source]
        source: Option<std::io::Error>,
    },
    /// A supervisor was handed a job with more or fewer descriptors than
    /// the job says come with it.
    #[error("the supervisor was handed {handed} descriptors where {due} were due")]
    HandoffDescriptors {
        /// How many came.
        handed: usize,
        /// How many the job says come with it.
        due: usize,
    },
    /// `--host-view` was given an argument vector it cannot read.
    #[error("{0}")]
    Usage(String),
}

impl GuestError {
    /// The OS error number at the root of this error, if there is one.
    pub(crate) fn errno(&self) -> Option<i32> {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(e) = cause {
            if let Some(io) = e.downcast_ref::<std::io::Error>() {
                if let Some(n) = io.raw_os_error() {
                    return Some(n);
                }
            }
            if let Some(n) = e.downcast_ref::<hako_sys::rustix::io::Errno>() {
                return Some(n.raw_os_error());
            }
            cause = e.source();
        }
        None
    }
}

/// For `map_err`: `op` failed with the error given ("cannot {op}: {e}").
pub(crate) fn failed<E: Into<Source>>(op: &'static str) -> impl FnOnce(E) -> GuestError {
    move |e| GuestError::Failed {
        op,
        source: e.into(),
    }
}

/// For `map_err`: `op` on `path` failed with the error given ("cannot {op}
/// {path}: {e}").
pub(crate) fn failed_on<'a, E: Into<Source>>(
    op: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(E) -> GuestError + 'a {
    move |e| GuestError::FailedOn {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn eperm() -> std::io::Error {
        std::io::Error::from_raw_os_error(1)
    }

    #[test]
    fn an_operation_says_what_failed_and_with_what() {
        let err = failed("open signalfd")(eperm());
        assert_eq!(
            err.to_string(),
            format!("cannot open signalfd: {}", eperm())
        );
        let source = std::error::Error::source(&err).expect("the OS error is its source");
        assert_eq!(source.to_string(), eperm().to_string());
    }

    #[test]
    fn an_operation_on_a_path_names_the_path() {
        let err = failed_on("mask", std::path::Path::new("/etc/shadow"))(eperm());
        assert_eq!(
            err.to_string(),
            format!("cannot mask /etc/shadow: {}", eperm())
        );
    }

    #[test]
    fn a_step_of_a_larger_operation_says_both() {
        let step = failed("set no_new_privs")(eperm());
        let err = failed("seal the sandbox")(step);
        assert_eq!(
            err.to_string(),
            format!(
                "cannot seal the sandbox: cannot set no_new_privs: {}",
                eperm()
            )
        );
    }

    #[test]
    fn hints_follow_the_error() {
        let err = GuestError::FailedWithHint {
            op: "create namespaces",
            source: eperm().into(),
            hint: "kernel.unprivileged_userns_clone=0".into(),
        };
        assert_eq!(
            err.to_string(),
            format!(
                "cannot create namespaces: {}; hint: kernel.unprivileged_userns_clone=0",
                eperm()
            )
        );
        let err = GuestError::Unmet {
            requirement: "Landlock is required but this kernel does not offer it",
            hint: "pass --best-effort to run without it",
        };
        assert_eq!(
            err.to_string(),
            "Landlock is required but this kernel does not offer it; hint: pass --best-effort to run without it"
        );
    }

    #[test]
    fn a_bad_handoff_says_why_when_it_knows() {
        let bare = GuestError::BadHandoff {
            what: "the memfd of a large job held no job",
            source: None,
        };
        assert_eq!(bare.to_string(), "the memfd of a large job held no job");
        assert!(std::error::Error::source(&bare).is_none());
        let with = GuestError::BadHandoff {
            what: "the supervisor was handed something that is not a job",
            source: Some(std::io::Error::other("truncated")),
        };
        assert_eq!(
            with.to_string(),
            "the supervisor was handed something that is not a job: truncated"
        );
        let count = GuestError::HandoffDescriptors { handed: 3, due: 4 };
        assert_eq!(
            count.to_string(),
            "the supervisor was handed 3 descriptors where 4 were due"
        );
    }

    #[test]
    fn requests_refused_keep_their_words() {
        assert_eq!(
            GuestError::IdInUse { id: 7 }.to_string(),
            "id 7 is already in use"
        );
        assert_eq!(
            GuestError::SessionBusy {
                session: 1,
                running: 2
            }
            .to_string(),
            "session 1 is busy running command 2"
        );
        assert_eq!(
            GuestError::Version {
                asked: 3,
                speaks: 4
            }
            .to_string(),
            "protocol version 3 is not supported; this guest speaks 4"
        );
    }
}
