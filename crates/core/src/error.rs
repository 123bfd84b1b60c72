use std::io;
use std::path::PathBuf;

use crate::fs::FileKind;
use crate::isolation::Isolation;

/// The result type of every sandbox operation.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A file operation the fence refused or could not do.
///
/// Every variant names the path as the caller gave it. Refusals (the first
/// group) are decided before anything is changed: the sandbox stays usable and
/// nothing is half-written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The path climbs out of the root with `..`.
    #[error("refused {path:?}: `..` climbs out of the sandbox root")]
    DotDotEscape {
        /// The path as given.
        path: PathBuf,
    },
    /// An absolute path that is not under the sandbox root.
    #[error("refused {path:?}: absolute path outside the sandbox root")]
    AbsoluteOutside {
        /// The path as given.
        path: PathBuf,
    },
    /// Resolving the path crossed a symlink that points outside the root (or
    /// is absolute), or the path moved out of the root while it was resolved.
    #[error("refused {path:?}: a symlink on the path leads outside the sandbox root")]
    SymlinkEscape {
        /// The path as given.
        path: PathBuf,
    },
    /// Resolving the path crossed a magic link such as `/proc/self/fd/N`, or
    /// a symlink loop.
    #[error("refused {path:?}: the path crosses a magic link (/proc/*/fd, /proc/*/root, ...) or a symlink loop")]
    MagicLink {
        /// The path as given.
        path: PathBuf,
    },
    /// A NUL byte in the path.
    #[error("refused {path:?}: the path contains a NUL byte")]
    NulByte {
        /// The path as given (NUL shown escaped).
        path: PathBuf,
    },
    /// The path, or one of its components, is longer than the kernel allows.
    #[error("refused {path:?}: {what} is {len} bytes, the limit is {max}")]
    TooLong {
        /// The path as given (possibly shortened for the message).
        path: PathBuf,
        /// `path` or `component`.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The limit in bytes.
        max: usize,
    },
    /// The operation needs a regular file and found a FIFO, device, socket or
    /// directory. Nothing was opened for reading or writing.
    #[error("refused {path:?}: it is a {kind}, not a regular file")]
    NotRegularFile {
        /// The path as given.
        path: PathBuf,
        /// What it is.
        kind: FileKind,
    },
    /// Writing or creating through a symlink whose target does not exist;
    /// the target is never created.
    #[error("refused {path:?}: it is a dangling symlink; hako never creates a symlink's target")]
    DanglingSymlink {
        /// The path as given.
        path: PathBuf,
    },
    /// Appending to a file with more than one hard link would change a file
    /// that may live outside the sandbox root.
    #[error("refused {path:?}: the file has {links} hard links; appending in place could change a file outside the sandbox root")]
    Hardlinked {
        /// The path as given.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// The path names the root itself or ends in `.` or `..` where a file
    /// name is needed.
    #[error("refused {path:?}: it does not name a file inside the sandbox root")]
    NoFileName {
        /// The path as given.
        path: PathBuf,
    },
    /// A whole-file read of a file larger than the sandbox's read limit.
    #[error("refused {path:?}: the file is {size} bytes, more than the read limit of {max}; read it with a byte limit")]
    FileTooLarge {
        /// The path as given.
        path: PathBuf,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// The path does not exist.
    #[error("{path:?} does not exist")]
    NotFound {
        /// The path as given.
        path: PathBuf,
    },
    /// A directory operation found something that is not a directory.
    #[error("{path:?} is not a directory")]
    NotADirectory {
        /// The path as given.
        path: PathBuf,
    },
    /// A file operation found a directory.
    #[error("{path:?} is a directory")]
    IsADirectory {
        /// The path as given.
        path: PathBuf,
    },
    /// `remove` of a directory that still has entries; removal is never
    /// recursive.
    #[error("refused {path:?}: the directory is not empty and removal is never recursive")]
    DirectoryNotEmpty {
        /// The path as given.
        path: PathBuf,
    },
    /// Something exists where a directory was to be made.
    #[error("{path:?} exists and is not a directory")]
    AlreadyExists {
        /// The path as given.
        path: PathBuf,
    },
    /// A write that was to replace what the caller read (an edit) found
    /// the file changed since: written to meanwhile, replaced or removed.
    /// Nothing was written; read it again and redo the edit.
    #[error("refused {path:?}: the file changed since it was read (written, replaced or removed meanwhile); nothing was written: read it again and redo the edit")]
    ChangedMeanwhile {
        /// The path as given.
        path: PathBuf,
    },
    /// Any other OS error, with the operation that failed.
    #[error("{op} {path:?}: {source}")]
    Io {
        /// The operation, e.g. `open`, `rename`.
        op: &'static str,
        /// The path as given.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl FenceError {
    /// The path the error is about, as the caller gave it.
    pub fn path(&self) -> &std::path::Path {
        match self {
            FenceError::DotDotEscape { path }
            | FenceError::AbsoluteOutside { path }
            | FenceError::SymlinkEscape { path }
            | FenceError::MagicLink { path }
            | FenceError::NulByte { path }
            | FenceError::TooLong { path, .. }
            | FenceError::NotRegularFile { path, .. }
            | FenceError::DanglingSymlink { path }
            | FenceError::Hardlinked { path, .. }
            | FenceError::NoFileName { path }
            | FenceError::FileTooLarge { path, .. }
            | FenceError::NotFound { path }
            | FenceError::NotADirectory { path }
            | FenceError::IsADirectory { path }
            | FenceError::DirectoryNotEmpty { path }
            | FenceError::AlreadyExists { path }
            | FenceError::ChangedMeanwhile { path }
            | FenceError::Io { path, .. } => path,
        }
    }

    /// Whether this is a policy refusal (a hostile or unsupported path) as
    /// opposed to an ordinary file-system condition such as "not found".
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            FenceError::DotDotEscape { .. }
                | FenceError::AbsoluteOutside { .. }
                | FenceError::SymlinkEscape { .. }
                | FenceError::MagicLink { .. }
                | FenceError::NulByte { .. }
                | FenceError::TooLong { .. }
                | FenceError::NotRegularFile { .. }
                | FenceError::DanglingSymlink { .. }
                | FenceError::Hardlinked { .. }
                | FenceError::NoFileName { .. }
                | FenceError::FileTooLarge { .. }
        )
    }
}

/// Everything a sandbox operation can fail with.
///
/// A command that runs and exits non-zero is not an error; it is an
/// [`Output`](crate::Output).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file operation was refused by the fence or failed.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// The policy requires a stronger boundary than this sandbox has.
    #[error("refused to run: the policy requires isolation `{required}` but the {backend} backend provides only `{actual}`")]
    IsolationTooWeak {
        /// What the policy requires.
        required: Isolation,
        /// What the sandbox has.
        actual: Isolation,
        /// The backend's name.
        backend: String,
    },
    /// The program was not found in the sandbox.
    #[error("command not found: {program:?}")]
    CommandNotFound {
        /// The program as given.
        program: String,
    },
    /// The program exists but cannot be executed (permissions, format).
    #[error("cannot execute {program:?}: {source}")]
    CannotExecute {
        /// The program as given.
        program: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The command is malformed: empty argv, a NUL byte in an argument or an
    /// environment variable, a bad variable name.
    #[error("invalid command: {reason}")]
    InvalidCommand {
        /// What is wrong with it.
        reason: String,
    },
    /// The sandbox has been closed.
    #[error("the sandbox is closed")]
    Closed,
    /// The session does not exist or has ended (closed, or its shell
    /// exited); open a new one.
    #[error("session {session} is not open: {reason}")]
    SessionNotOpen {
        /// The session.
        session: u64,
        /// Why: never opened, closed, or how its shell ended.
        reason: String,
    },
    /// No process has this handle in this sandbox (never started, or
    /// forgotten after it ended and many more ended since).
    #[error("no process {process} in this sandbox")]
    NoSuchProcess {
        /// The handle.
        process: u64,
    },
    /// The session is running another command; a session runs one at a
    /// time (open another session to run commands at once).
    #[error(
        "session {session} is busy running another command; wait for it or use another session"
    )]
    SessionBusy {
        /// The session.
        session: u64,
    },
    /// A bound on what one sandbox holds at once was reached (shell
    /// sessions open, long-lived processes running); nothing was started.
    #[error("refused: {limit} {what} are already open in this sandbox, the most it allows ({flag}); {hint}")]
    LimitReached {
        /// What is bounded: `shell sessions`, `processes`.
        what: &'static str,
        /// The bound.
        limit: usize,
        /// The flag (and profile key) that sets it.
        flag: &'static str,
        /// What to do.
        hint: &'static str,
    },
    /// The machine, or this process, has run out of something a sandbox
    /// needs (processes, descriptors, memory); nothing was started.
    /// Closing sandboxes, or raising the limit named, makes room.
    #[error("cannot {op}: out of {resource}: {message}")]
    OutOfResources {
        /// What was being done.
        op: &'static str,
        /// What ran out: `processes`, `descriptors` or `memory`.
        resource: &'static str,
        /// The limit, how much of it is used, and what raises it.
        message: String,
    },
    /// The backend does not offer this optional capability.
    #[error("the {backend} backend does not support {capability}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// The capability.
        capability: &'static str,
    },
    /// The network policy is malformed (an allowlist entry, a resolve
    /// override).
    #[error("invalid network policy: {message}")]
    BadNetworkPolicy {
        /// What is wrong, naming the entry.
        message: String,
    },
    /// The backend cannot enforce the network mode asked for; nothing was
    /// started (fail closed).
    #[error("the {backend} backend cannot provide network mode `{mode}`: {reason}")]
    NetworkUnavailable {
        /// The backend's name.
        backend: String,
        /// The mode asked for.
        mode: &'static str,
        /// Why, with what to do instead.
        reason: String,
    },
    /// The sandbox machinery itself failed (could not start, died).
    #[error("{backend} backend: {op}: {message}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// What it was doing.
        op: &'static str,
        /// What went wrong, with a hint where one helps.
        message: String,
    },
    /// The sandbox was lost while open: its guest (the sandbox's pid 1,
    /// its container, or gVisor's sandbox process, which is its kernel)
    /// ended without being asked to, killed from outside or stopped with
    /// its engine. Every call in progress and every later one fails with
    /// this; nothing more runs in it. Closing it still works (and removes
    /// what is left); open another to go on.
    #[error("{backend} backend: {op}: the sandbox was lost: {reason}; close it and open another")]
    SandboxLost {
        /// The backend's name.
        backend: String,
        /// The call that found it lost.
        op: &'static str,
        /// What was lost and why, as far as hako could tell (what became
        /// of the guest, its container or its runtime).
        reason: String,
    },
    /// An OS error in the machinery, with the operation that failed.
    #[error("{op}: {source}")]
    Io {
        /// What it was doing.
        op: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The fence error inside, if this is one.
    pub fn as_fence(&self) -> Option<&FenceError> {
        match self {
            Error::Fence(err) => Some(err),
            _ => None,
        }
    }

    /// Whether this says the sandbox was lost (see
    /// [`Error::SandboxLost`]): nothing more runs in it.
    pub fn is_sandbox_lost(&self) -> bool {
        matches!(self, Error::SandboxLost { .. })
    }
}
