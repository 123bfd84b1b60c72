//! The component-walk resolver must agree with the kernel's openat2.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::os::fd::AsFd;
use std::os::unix::fs::symlink;
use std::path::Path;

use hako_core::FenceResolver;
use hako_fence::{resolver_available, Fence, FenceOptions};
use hako_sys::rustix::fs::{self as rfs, OFlags};

fn fixture() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("a/b")).unwrap();
    std::fs::write(ws.join("a/b/c.txt"), "c").unwrap();
    std::fs::write(tmp.path().join("outside.txt"), "secret").unwrap();
    for (link, target) in [
        ("a/up", ".."),
        ("a/upup", "../.."),
        ("a/self", "."),
        ("link_b", "a/b"),
        ("abs", "/etc"),
        ("chain1", "chain2"),
        ("chain2", "a/b/c.txt"),
        ("loop1", "loop2"),
        ("loop2", "loop1"),
        ("deep", "a/b/../b"),
        ("dangling", "nothere"),
        ("esc_mid", "a/../../outside.txt"),
        ("a/b/back", "../../link_b/c.txt"),
    ] {
        symlink(target, ws.join(link)).unwrap();
    }
    tmp
}

const PATHS: &[&str] = &[
    ".",
    "a/b/c.txt",
    "a/up/a/b/c.txt",
    "a/up/..",
    "a/upup/outside.txt",
    "a/self/b/c.txt",
    "link_b/c.txt",
    "link_b/..",
    "link_b/../b/c.txt",
    "abs",
    "abs/passwd",
    "chain1",
    "loop1",
    "deep/c.txt",
    "dangling",
    "esc_mid",
    "a/b/back",
    "a/b/c.txt/x",
    "a/../a/b",
    "missing/x",
];

/// (device, inode) of what was opened, or the errno.
fn outcome(fence: &Fence, path: &str, nofollow: bool) -> Result<(u64, u64), i32> {
    let mut flags = OFlags::PATH;
    if nofollow {
        flags |= OFlags::NOFOLLOW;
    }
    let rel = fence.relative(Path::new(path)).map_err(|_| -1)?;
    let fd = hako_fence_open(fence, &rel, flags)?;
    let st = rfs::fstat(fd.as_fd()).unwrap();
    Ok((st.st_dev, st.st_ino))
}

fn hako_fence_open(fence: &Fence, rel: &Path, flags: OFlags) -> Result<std::os::fd::OwnedFd, i32> {
    hako_fence::open_beneath(
        fence.resolver(),
        fence.root(),
        rel,
        flags,
        rfs::Mode::empty(),
    )
    .map_err(|e| e.raw_os_error())
}

#[test]
fn component_walk_agrees_with_openat2_on_every_tricky_path() {
    if !resolver_available(FenceResolver::Openat2) {
        eprintln!("skipped: this kernel has no openat2 to compare with");
        assert!(std::env::var("HAKO_MUST_WORK").is_err());
        return;
    }
    let tmp = fixture();
    let ws = tmp.path().join("ws");
    let open = |resolver| {
        Fence::open(
            &ws,
            FenceOptions {
                resolver: Some(resolver),
                ..FenceOptions::default()
            },
        )
        .unwrap()
    };
    let kernel = open(FenceResolver::Openat2);
    let walk = open(FenceResolver::ComponentWalk);
    let mut escapes = 0;
    for path in PATHS {
        for nofollow in [false, true] {
            let k = outcome(&kernel, path, nofollow);
            let w = outcome(&walk, path, nofollow);
            assert_eq!(k, w, "{path} (nofollow: {nofollow})");
            if k == Err(libc_exdev()) {
                escapes += 1;
            }
        }
    }
    // The fixture must actually exercise escapes, or this proves little.
    assert!(escapes >= 6, "only {escapes} escapes exercised");
}

fn libc_exdev() -> i32 {
    hako_sys::rustix::io::Errno::XDEV.raw_os_error()
}

/// A writer blocked in `open(O_WRONLY)` on a FIFO is released only when
/// someone opens the FIFO for reading: if the fence's refused read leaves it
/// blocked, the fence never opened the FIFO.
#[test]
fn fifo_is_refused_without_being_opened() {
    use std::sync::mpsc;
    use std::time::Duration;
    let tmp = tempfile::tempdir().unwrap();
    let fifo = tmp.path().join("fifo");
    rfs::mknodat(
        rfs::CWD,
        &fifo,
        rfs::FileType::Fifo,
        rfs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let writer_path = fifo.clone();
    let writer = std::thread::spawn(move || {
        let opened = std::fs::OpenOptions::new().write(true).open(&writer_path);
        tx.send(opened.is_ok()).unwrap();
    });
    // Let the writer block in open() first.
    std::thread::sleep(Duration::from_millis(100));
    for resolver in [FenceResolver::Openat2, FenceResolver::ComponentWalk] {
        if !resolver_available(resolver) {
            continue;
        }
        let fence = Fence::open(
            tmp.path(),
            FenceOptions {
                resolver: Some(resolver),
                ..FenceOptions::default()
            },
        )
        .unwrap();
        let err = fence.read(Path::new("fifo"), 10).unwrap_err();
        assert!(
            matches!(err, hako_core::FenceError::NotRegularFile { .. }),
            "{err}"
        );
        assert!(fence.read_all(Path::new("fifo")).is_err());
    }
    assert!(
        rx.recv_timeout(Duration::from_millis(300)).is_err(),
        "the writer was released: the fence opened the FIFO"
    );
    // Release the writer ourselves.
    let _reader = std::fs::File::open(&fifo).unwrap();
    assert!(rx.recv_timeout(Duration::from_secs(30)).unwrap());
    writer.join().unwrap();
}

#[test]
fn an_edit_of_a_file_the_sandbox_changed_since_it_was_read_is_refused_and_nothing_is_lost() {
    use hako_core::FenceError;
    let tmp = tempfile::tempdir().unwrap();
    let fence = Fence::open(tmp.path(), hako_fence::FenceOptions::default()).unwrap();
    let file = tmp.path().join("a.txt");
    std::fs::write(&file, "one\n").unwrap();
    let read = fence.read_all(Path::new("a.txt")).unwrap();
    // Unchanged: the edit is written.
    fence
        .write_if_unchanged(Path::new("a.txt"), b"two\n", &read)
        .unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "two\n");
    // Written to in place since the read (same size, same inode).
    let read = fence.read_all(Path::new("a.txt")).unwrap();
    std::fs::write(&file, "TWO\n").unwrap();
    let err = fence
        .write_if_unchanged(Path::new("a.txt"), b"three\n", &read)
        .unwrap_err();
    assert!(
        matches!(err, FenceError::ChangedMeanwhile { ref path } if path == Path::new("a.txt")),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "TWO\n");
    // Replaced by a rename since the read.
    let read = fence.read_all(Path::new("a.txt")).unwrap();
    std::fs::write(tmp.path().join("b.txt"), "TW0\n").unwrap();
    std::fs::rename(tmp.path().join("b.txt"), &file).unwrap();
    let err = fence
        .write_if_unchanged(Path::new("a.txt"), b"three\n", &read)
        .unwrap_err();
    assert!(matches!(err, FenceError::ChangedMeanwhile { .. }), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "TW0\n");
    // Replaced by the very same bytes: nothing would be lost, the edit is
    // written.
    let read = fence.read_all(Path::new("a.txt")).unwrap();
    std::fs::write(tmp.path().join("b.txt"), "TW0\n").unwrap();
    std::fs::rename(tmp.path().join("b.txt"), &file).unwrap();
    fence
        .write_if_unchanged(Path::new("a.txt"), b"TWO\n", &read)
        .unwrap();
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "TWO\n");
    // Removed since the read: not recreated.
    let read = fence.read_all(Path::new("a.txt")).unwrap();
    std::fs::remove_file(&file).unwrap();
    let err = fence
        .write_if_unchanged(Path::new("a.txt"), b"three\n", &read)
        .unwrap_err();
    assert!(matches!(err, FenceError::ChangedMeanwhile { .. }), "{err}");
    assert!(!file.exists());
    // No temporary file is left by the refusals.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
