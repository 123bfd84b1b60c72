//! Special files planted in the workspace: FIFOs, device nodes, hard links
//! to outside files.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use hako_core::{Error, FenceError, FileKind};

use crate::check::{bytes_eq, expect_fence, host_kind, within, Ctx, Fk, Res};
use crate::harness::{is_root, OUTSIDE_SECRET};
use crate::Harness;

/// How long a refusal may take before the case calls it blocking.
const BLOCK_LIMIT: Duration = Duration::from_secs(10);

/// Fails unless `result` is `NotRegularFile` of `kind`.
fn not_regular<T: std::fmt::Debug>(result: Result<T, Error>, kind: FileKind, what: &str) -> Res {
    match &result {
        Err(Error::Fence(FenceError::NotRegularFile { kind: k, .. })) if *k == kind => Ok(()),
        _ => fail!("{what}: got {result:?}, expected NotRegularFile {{ kind: {kind:?} }}"),
    }
}

/// Tries reading, bounded reading, appending and writing `path`, each on a
/// thread with a deadline, expecting `NotRegularFile` of `kind`.
fn refused_without_blocking(h: &Harness, path: &str, kind: FileKind, unblock: &dyn Fn()) -> Res {
    let sb = h.sandbox();
    let p = Path::new(path);
    let r = within(
        BLOCK_LIMIT,
        &format!("read_file {path}"),
        || sb.read_file(p),
        unblock,
    )?;
    not_regular(r, kind, &format!("read_file {path}"))?;
    // The optional traits are not `Sync`: reach them on the thread.
    let r = within(
        BLOCK_LIMIT,
        &format!("read_file_limit {path}"),
        || sb.read_limit().map(|l| l.read_file_limit(p, 16)),
        unblock,
    )?;
    if let Some(r) = r {
        not_regular(r, kind, &format!("read_file_limit {path}"))?;
    }
    let r = within(
        BLOCK_LIMIT,
        &format!("append_file {path}"),
        || sb.append().map(|a| a.append_file(p, b"x")),
        unblock,
    )?;
    if let Some(r) = r {
        not_regular(r, kind, &format!("append_file {path}"))?;
    }
    let r = within(
        BLOCK_LIMIT,
        &format!("write_file {path}"),
        || sb.write_file(p, b"x"),
        unblock,
    )?;
    not_regular(r, kind, &format!("write_file {path}"))
}

case! {
    /// Reading a FIFO (directly or through a symlink) returns
    /// `NotRegularFile` at once, never blocking for a writer; appending and
    /// writing are refused too, and the FIFO stays a FIFO.
    fn reading_a_fifo_is_refused_without_blocking(h) {
        h.plant_fifo("fifo")?;
        h.plant_symlink("fifo_link", "fifo")?;
        let fifo = h.host_path("fifo");
        // Releases an operation blocked opening the FIFO, so the case can end.
        let unblock = || {
            use hako_sys::rustix::fs::{open, Mode, OFlags};
            for flags in [OFlags::WRONLY, OFlags::RDONLY] {
                let _ = open(&fifo, flags | OFlags::NONBLOCK | OFlags::CLOEXEC, Mode::empty());
            }
        };
        refused_without_blocking(h, "fifo", FileKind::Fifo, &unblock)?;
        refused_without_blocking(h, "fifo_link", FileKind::Fifo, &unblock)?;
        expect_fence(h.sandbox().list_dir(Path::new("fifo")), &[Fk::NotADirectory], "list a FIFO")?;
        ensure_eq!(host_kind(&fifo), Some(FileKind::Fifo), "the FIFO afterwards");
        ensure_eq!(host_kind(&h.host_path("fifo_link")), Some(FileKind::Symlink), "the link afterwards");
        Ok(())
    }
}

case! {
    /// A character device node planted inside (`c 1 3`, /dev/null's numbers)
    /// is refused as `NotRegularFile` by every read and write, directly and
    /// through a symlink. Needs root to plant.
    fn reading_a_device_node_is_refused(h) {
        use hako_sys::rustix::fs::{makedev, mknodat, FileType, Mode, CWD};
        if !is_root() {
            skip!("planting a device node needs root");
        }
        let node = h.host_path("null");
        if let Err(e) = mknodat(CWD, &node, FileType::CharacterDevice, Mode::from_raw_mode(0o666), makedev(1, 3)) {
            skip!("mknod c 1 3 is not permitted here: {e}");
        }
        h.plant_symlink("null_link", "null")?;
        refused_without_blocking(h, "null", FileKind::CharDevice, &|| {})?;
        refused_without_blocking(h, "null_link", FileKind::CharDevice, &|| {})?;
        ensure_eq!(host_kind(&node), Some(FileKind::CharDevice), "the device node afterwards");
        Ok(())
    }
}

case! {
    /// A hard link to an outside file: appending (directly or through a
    /// symlink) is refused as `Hardlinked` and the outside file is
    /// unchanged; writing replaces the link's name with a new file and
    /// leaves the outside file unchanged.
    fn hardlink_to_an_outside_file_is_never_written_through(h) {
        let secret = h.outside().join("secret");
        if let Err(e) = std::fs::hard_link(&secret, h.host_path("hl")) {
            skip!("cannot hard-link across the workspace and the outside dir: {e}");
        }
        h.plant_symlink("hl_link", "hl")?;
        let sb = h.sandbox();
        if let Some(append) = sb.append() {
            for path in ["hl", "hl_link"] {
                match append.append_file(Path::new(path), b"APPENDED") {
                    Err(Error::Fence(FenceError::Hardlinked { links, .. })) => {
                        ensure_eq!(links, 2, "link count in the error for {path}")
                    }
                    other => fail!("append {path}: got {other:?}, expected Hardlinked"),
                }
                h.check_outside()?;
            }
        }
        sb.write_file(Path::new("hl"), b"REPLACED").ctx("write hl")?;
        bytes_eq(&std::fs::read(h.host_path("hl")).ctx("host read hl")?, b"REPLACED", "hl after write")?;
        bytes_eq(&std::fs::read(&secret).ctx("host read secret")?, OUTSIDE_SECRET, "the outside file")?;
        ensure_eq!(
            std::fs::metadata(h.host_path("hl")).ctx("stat hl")?.nlink(),
            1,
            "links of the new hl"
        );
        ensure_eq!(std::fs::metadata(&secret).ctx("stat secret")?.nlink(), 1, "links of the outside file");
        h.check_outside()
    }
}
