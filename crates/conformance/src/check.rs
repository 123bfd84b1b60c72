//! Small helpers the cases share: early-return checks, error kinds, and the
//! operations every fence case drives.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hako_core::{Command, Error, ExitStatus, FenceError, FileKind, Output};

use crate::{Harness, Outcome};

/// What a case body returns: `Err` carries a failure or a skip.
pub(crate) type Res<T = ()> = Result<T, Outcome>;

/// Fails the case with a message unless `cond` holds.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err($crate::Outcome::Failed(format!($($fmt)+)));
        }
    };
}

/// Fails the case unless `left == right`, showing both.
macro_rules! ensure_eq {
    ($left:expr, $right:expr, $($fmt:tt)+) => {
        match (&$left, &$right) {
            (left, right) => {
                if left != right {
                    return Err($crate::Outcome::Failed(format!(
                        "{}: got {:?}, expected {:?}",
                        format!($($fmt)+),
                        left,
                        right
                    )));
                }
            }
        }
    };
}

/// Fails the case now.
macro_rules! fail {
    ($($fmt:tt)+) => {
        return Err($crate::Outcome::Failed(format!($($fmt)+)))
    };
}

/// Skips the case now, with a reason.
macro_rules! skip {
    ($($fmt:tt)+) => {
        return Err($crate::Outcome::Skipped(format!($($fmt)+)))
    };
}

/// Adds what was being done to an unexpected error.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: impl fmt::Display) -> Res<T>;
}

impl<T, E: fmt::Debug> Ctx<T> for Result<T, E> {
    fn ctx(self, what: impl fmt::Display) -> Res<T> {
        self.map_err(|e| Outcome::Failed(format!("{what}: unexpected error {e:?}")))
    }
}

impl<T> Ctx<T> for Option<T> {
    fn ctx(self, what: impl fmt::Display) -> Res<T> {
        self.ok_or_else(|| Outcome::Failed(format!("{what}: nothing there")))
    }
}

/// A short, readable rendering of bytes for messages.
pub(crate) fn show(bytes: &[u8]) -> String {
    const MAX: usize = 160;
    let head = &bytes[..bytes.len().min(MAX)];
    let mut s = format!("{:?}", String::from_utf8_lossy(head));
    if bytes.len() > MAX {
        s.push_str(&format!("... ({} bytes)", bytes.len()));
    }
    s
}

/// Fails unless two byte strings are equal, without dumping megabytes.
pub(crate) fn bytes_eq(got: &[u8], expected: &[u8], what: impl fmt::Display) -> Res {
    if got != expected {
        let first = got
            .iter()
            .zip(expected)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(expected.len()));
        fail!(
            "{what}: got {} bytes {}, expected {} bytes {} (first difference at byte {first})",
            got.len(),
            show(got),
            expected.len(),
            show(expected)
        );
    }
    Ok(())
}

/// The variant of a fence error, without its fields, so that cases can name
/// what they expect exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fk {
    DotDotEscape,
    AbsoluteOutside,
    SymlinkEscape,
    MagicLink,
    NulByte,
    TooLongPath,
    TooLongComponent,
    NotRegularFile,
    DanglingSymlink,
    Hardlinked,
    NoFileName,
    FileTooLarge,
    NotFound,
    NotADirectory,
    IsADirectory,
    DirectoryNotEmpty,
    AlreadyExists,
    Io,
}

/// The fence kind of an error, `None` when it is not a fence error.
pub(crate) fn fence_kind(err: &Error) -> Option<Fk> {
    Some(match err.as_fence()? {
        FenceError::DotDotEscape { .. } => Fk::DotDotEscape,
        FenceError::AbsoluteOutside { .. } => Fk::AbsoluteOutside,
        FenceError::SymlinkEscape { .. } => Fk::SymlinkEscape,
        FenceError::MagicLink { .. } => Fk::MagicLink,
        FenceError::NulByte { .. } => Fk::NulByte,
        FenceError::TooLong { what: "path", .. } => Fk::TooLongPath,
        FenceError::TooLong { .. } => Fk::TooLongComponent,
        FenceError::NotRegularFile { .. } => Fk::NotRegularFile,
        FenceError::DanglingSymlink { .. } => Fk::DanglingSymlink,
        FenceError::Hardlinked { .. } => Fk::Hardlinked,
        FenceError::NoFileName { .. } => Fk::NoFileName,
        FenceError::FileTooLarge { .. } => Fk::FileTooLarge,
        FenceError::NotFound { .. } => Fk::NotFound,
        FenceError::NotADirectory { .. } => Fk::NotADirectory,
        FenceError::IsADirectory { .. } => Fk::IsADirectory,
        FenceError::DirectoryNotEmpty { .. } => Fk::DirectoryNotEmpty,
        FenceError::AlreadyExists { .. } => Fk::AlreadyExists,
        _ => Fk::Io,
    })
}

/// Fails unless `result` is a fence error of one of `kinds`.
pub(crate) fn expect_fence<T: fmt::Debug>(
    result: Result<T, Error>,
    kinds: &[Fk],
    what: impl fmt::Display,
) -> Res {
    match result {
        Ok(v) => fail!("{what}: succeeded with {v:?}, expected a refusal {kinds:?}"),
        Err(e) => match fence_kind(&e) {
            Some(k) if kinds.contains(&k) => Ok(()),
            _ => fail!("{what}: got {e:?}, expected one of {kinds:?}"),
        },
    }
}

/// The file operations of the interface, for cases that try one path
/// through every operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    ReadLimit,
    Write,
    Append,
    Remove,
    List,
    MakeDir,
    Stat,
    Cwd,
}

impl Op {
    pub(crate) const ALL: [Op; 9] = [
        Op::Read,
        Op::ReadLimit,
        Op::Write,
        Op::Append,
        Op::Remove,
        Op::List,
        Op::MakeDir,
        Op::Stat,
        Op::Cwd,
    ];
    /// The operations that act on the final component rather than on the
    /// entry itself (everything but `remove` and `stat`, which act on a
    /// final symlink without following it).
    pub(crate) const FOLLOWING: [Op; 7] = [
        Op::Read,
        Op::ReadLimit,
        Op::Write,
        Op::Append,
        Op::List,
        Op::MakeDir,
        Op::Cwd,
    ];
}

/// What a hostile write or append puts in a file.
pub(crate) const ATTACK_DATA: &[u8] = b"HAKO-ATTACK-DATA";

/// Runs one operation on `path`; `None` when the sandbox does not offer it.
///
/// `Op::Cwd` runs a command in `path` that would leave a file behind in the
/// workspace root; when the exec is refused, that file must not exist.
pub(crate) fn apply(h: &Harness, op: Op, path: &Path) -> Option<Result<(), Error>> {
    let sb = h.sandbox();
    Some(match op {
        Op::Read => sb.read_file(path).map(drop),
        Op::ReadLimit => sb.read_limit()?.read_file_limit(path, 1 << 20).map(drop),
        Op::Write => sb.write_file(path, ATTACK_DATA),
        Op::Append => sb.append()?.append_file(path, ATTACK_DATA),
        Op::Remove => sb.remove(path),
        Op::List => sb.list_dir(path).map(drop),
        Op::MakeDir => sb.make_dir_all()?.make_dir_all(path),
        Op::Stat => sb.stat()?.stat(path).map(drop),
        Op::Cwd => {
            let ran = h.ran_marker();
            let result = exec_ran_marker(h, path, &ran);
            if result.is_err() && h.host_path(&ran).symlink_metadata().is_ok() {
                return Some(Err(Error::InvalidCommand {
                    reason: format!(
                        "CONFORMANCE: exec in {path:?} was refused ({result:?}) but the command ran"
                    ),
                }));
            }
            result
        }
    })
}

/// Runs, in `cwd`, a command that creates `ran` (a name in the workspace
/// root, written through the in-sandbox absolute path when there is one).
fn exec_ran_marker(h: &Harness, cwd: &Path, ran: &Path) -> Result<(), Error> {
    let target = match h.sandbox().workdir() {
        Some(w) => w.workdir().join(ran),
        None => ran.to_path_buf(),
    };
    let command = Command::new([
        "/bin/sh".to_string(),
        "-c".to_string(),
        "echo ran > \"$1\"".to_string(),
        "sh".to_string(),
        target.to_string_lossy().into_owned(),
    ])
    .cwd(cwd)
    .timeout(Duration::from_secs(60));
    h.sandbox().exec(&command).map(drop)
}

/// Tries `path` through each of `ops`, expecting a refusal of one of
/// `kinds`, and checks that nothing in the workspace changed.
pub(crate) fn refused(h: &Harness, path: &Path, ops: &[Op], kinds: &[Fk]) -> Res {
    let before = h.snapshot_workspace().ctx("snapshot the workspace")?;
    for &op in ops {
        if let Some(result) = apply(h, op, path) {
            expect_fence(result, kinds, format!("{op:?} {path:?}"))?;
        }
        let after = h.snapshot_workspace().ctx("snapshot the workspace")?;
        if let Some(diff) = crate::harness::diff(&before, &after) {
            fail!("{op:?} {path:?} was refused but changed the workspace: {diff}");
        }
    }
    h.check_outside()
}

/// Runs a command and fails the case on an error.
pub(crate) fn run(h: &Harness, command: &Command) -> Res<Output> {
    h.sandbox()
        .exec(command)
        .ctx(format!("exec {:?}", command.program))
}

/// Runs `/bin/sh -c script` and fails the case on an error.
pub(crate) fn sh(h: &Harness, script: &str) -> Res<Output> {
    run(h, &Command::shell(script))
}

/// Fails unless the command exited 0 with exactly this stdout and an empty
/// stderr.
pub(crate) fn expect_output(out: &Output, stdout: &[u8], what: impl fmt::Display) -> Res {
    ensure!(
        out.status == ExitStatus::Code(0) && !out.timed_out,
        "{what}: status {:?} timed_out {} stderr {}",
        out.status,
        out.timed_out,
        show(&out.stderr)
    );
    bytes_eq(&out.stdout, stdout, format!("{what}: stdout"))?;
    bytes_eq(&out.stderr, b"", format!("{what}: stderr"))
}

/// Fails unless the sandbox still runs a command.
pub(crate) fn still_works(h: &Harness, after: impl fmt::Display) -> Res {
    let out = sh(h, "echo alive").map_err(|e| match e {
        Outcome::Failed(m) => Outcome::Failed(format!("after {after}: {m}")),
        other => other,
    })?;
    expect_output(&out, b"alive\n", format!("the sandbox after {after}"))
}

/// The in-sandbox absolute path of a workspace-relative path, when the
/// sandbox reports its workdir.
pub(crate) fn inside_abs(h: &Harness, rel: &str) -> Option<PathBuf> {
    h.sandbox().workdir().map(|w| w.workdir().join(rel))
}

/// Runs `f` on a scoped thread and fails if it has not returned after
/// `limit`; `unblock` is then called to release it (so the scope can end).
pub(crate) fn within<T: Send>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send,
    unblock: impl FnOnce(),
) -> Res<T> {
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        scope.spawn(move || {
            let _ = tx.send(f());
        });
        match rx.recv_timeout(limit) {
            Ok(v) => Ok(v),
            Err(_) => {
                unblock();
                Err(Outcome::Failed(format!(
                    "{what} did not return within {limit:?}: it blocks"
                )))
            }
        }
    })
}

/// The kind of a host path, from `lstat`.
pub(crate) fn host_kind(path: &Path) -> Option<FileKind> {
    use std::os::unix::fs::FileTypeExt;
    let ft = path.symlink_metadata().ok()?.file_type();
    Some(if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else if ft.is_fifo() {
        FileKind::Fifo
    } else if ft.is_char_device() {
        FileKind::CharDevice
    } else if ft.is_block_device() {
        FileKind::BlockDevice
    } else if ft.is_socket() {
        FileKind::Socket
    } else {
        FileKind::Unknown
    })
}
