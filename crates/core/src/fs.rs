use std::ffi::OsString;
use std::fmt;

use serde::{Deserialize, Serialize};

/// What a directory entry is, from `lstat` data: a symlink is reported as a
/// symlink, never as what it points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// A named pipe.
    Fifo,
    /// A unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// Anything else.
    Unknown,
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FileKind::File => "regular file",
            FileKind::Dir => "directory",
            FileKind::Symlink => "symlink",
            FileKind::Fifo => "FIFO",
            FileKind::Socket => "socket",
            FileKind::CharDevice => "character device",
            FileKind::BlockDevice => "block device",
            FileKind::Unknown => "file of unknown type",
        })
    }
}

/// `lstat` data of one path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// What it is.
    pub kind: FileKind,
    /// Size in bytes (for a symlink, the length of its target).
    pub size: u64,
    /// Permission bits (`0o7777` mask).
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
    /// Hard link count.
    pub links: u64,
    /// Where a symlink points, as stored; `None` for anything else.
    pub symlink_target: Option<OsString>,
}

/// One entry of a directory listing, from `lstat` data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry's name (not a path).
    pub name: OsString,
    /// What it is; symlinks are reported as symlinks.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub mtime: i64,
}

/// A directory's entries, sorted by name, at most the sandbox's entry limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirListing {
    /// The entries, without `.` and `..`.
    pub entries: Vec<DirEntry>,
    /// Whether the directory had more entries than the limit.
    pub truncated: bool,
}

/// The result of a bounded read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadOutcome {
    /// At most the requested number of bytes from the start of the file.
    pub data: Vec<u8>,
    /// Whether the file had more bytes than were read.
    pub truncated: bool,
}
