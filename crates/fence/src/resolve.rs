//! Resolving a relative path beneath a root descriptor.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use hako_core::FenceResolver;
use hako_sys::rustix::fs::{self as rfs, Mode, OFlags, ResolveFlags};
use hako_sys::rustix::io::Errno;

/// `openat2` retries when a concurrent rename makes the kernel ask for one.
const EAGAIN_RETRIES: usize = 64;
const MAX_SYMLINKS: usize = 40;

/// Whether `resolver` works on this kernel.
pub fn resolver_available(resolver: FenceResolver) -> bool {
    match resolver {
        FenceResolver::Openat2 => hako_sys::has_openat2(),
        FenceResolver::ComponentWalk => true,
    }
}

/// Opens `rel` beneath `root`.
///
/// Errors follow `openat2`'s: `EXDEV` when the path would leave the root,
/// `ELOOP` for a magic link or too many symlinks, and the usual `ENOENT`,
/// `ENOTDIR`, ... otherwise. With `O_NOFOLLOW` in `flags` a final symlink is
/// not followed.
pub fn open_beneath(
    resolver: FenceResolver,
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    match resolver {
        FenceResolver::Openat2 => {
            let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
            let mut tries = 0;
            loop {
                match rfs::openat2(root, rel, flags | OFlags::CLOEXEC, mode, resolve) {
                    Err(Errno::AGAIN) if tries < EAGAIN_RETRIES => tries += 1,
                    // The kernel gives up on `..` whenever any rename on the
                    // system races the lookup, so a busy machine (or anyone
                    // who can rename files) could deny every path with `..`.
                    // The walk handles `..` itself and is not affected.
                    Err(Errno::AGAIN) => {
                        return walk(root, rel, flags | OFlags::CLOEXEC, mode, &mut Vec::new())
                    }
                    other => return other,
                }
            }
        }
        FenceResolver::ComponentWalk => {
            walk(root, rel, flags | OFlags::CLOEXEC, mode, &mut Vec::new())
        }
    }
}

fn is_procfs(dir: BorrowedFd<'_>) -> bool {
    rfs::fstatfs(dir).is_ok_and(|s| s.f_type == rfs::PROC_SUPER_MAGIC)
}

/// Splices a symlink's target in front of the components still to walk.
fn splice(queue: &mut VecDeque<OsString>, target: &[u8]) -> Result<(), Errno> {
    let target = Path::new(OsStr::from_bytes(target));
    if target.is_absolute() {
        // openat2 with RESOLVE_BENEATH refuses absolute symlinks too.
        return Err(Errno::XDEV);
    }
    for component in target.components().rev() {
        match component {
            Component::Normal(name) => queue.push_front(name.to_owned()),
            Component::ParentDir => queue.push_front("..".into()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(Errno::XDEV),
        }
    }
    Ok(())
}

/// The component-by-component fallback. Every step opens one name with
/// `O_NOFOLLOW` relative to the descriptor of the step before, so the kernel
/// never follows a link on its own; symlinks are read and followed here,
/// and `..` pops a stack of descriptors instead of asking the kernel, so it
/// can never climb above the root.
///
/// `names` receives the path of what was opened, relative to the root, with
/// every symlink and `..` resolved.
fn walk(
    root: BorrowedFd<'_>,
    rel: &Path,
    flags: OFlags,
    mode: Mode,
    names: &mut Vec<OsString>,
) -> Result<OwnedFd, Errno> {
    names.clear();
    let mut queue: VecDeque<OsString> = VecDeque::new();
    for component in rel.components() {
        match component {
            Component::Normal(name) => queue.push_back(name.to_owned()),
            Component::ParentDir => queue.push_back("..".into()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return Err(Errno::XDEV),
        }
    }
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut followed = 0usize;
    let nofollow_final = flags.contains(OFlags::NOFOLLOW);
    while let Some(name) = queue.pop_front() {
        let cur = stack.last().map_or(root, |fd| fd.as_fd());
        if name == ".." {
            if stack.pop().is_none() {
                return Err(Errno::XDEV);
            }
            names.pop();
            continue;
        }
        let last = queue.is_empty();
        if last && nofollow_final {
            let fd = rfs::openat(cur, &name, flags, mode)?;
            names.push(name);
            return Ok(fd);
        }
        // Is it a symlink? Follow it by hand, beneath the root.
        match rfs::readlinkat(cur, &name, Vec::new()) {
            Ok(target) => {
                if is_procfs(cur) {
                    return Err(Errno::LOOP);
                }
                followed += 1;
                if followed > MAX_SYMLINKS {
                    return Err(Errno::LOOP);
                }
                splice(&mut queue, target.as_bytes())?;
                continue;
            }
            Err(Errno::INVAL) | Err(Errno::NOENT) => {}
            Err(e) => return Err(e),
        }
        if last {
            let fd = rfs::openat(cur, &name, flags | OFlags::NOFOLLOW, mode)?;
            names.push(name);
            return Ok(fd);
        }
        let next = rfs::openat(
            cur,
            &name,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        stack.push(next);
        names.push(name);
    }
    // The path ended in `..` or was the root itself.
    let cur = stack.last().map_or(root, |fd| fd.as_fd());
    rfs::openat(cur, ".", flags & !OFlags::NOFOLLOW, mode)
}

/// Opens the file an `O_PATH` descriptor refers to, with `flags`, without
/// resolving any path again: through the descriptor's own `/proc/self/fd`
/// entry. `ENOENT` means `/proc` is not mounted.
pub fn reopen(fd: &OwnedFd, flags: OFlags) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    rfs::open(link.as_str(), flags | OFlags::CLOEXEC, Mode::empty())
}

/// The path of the directory `rel` names, relative to the root, with every
/// symlink and `..` on the way resolved (for computing where a symlink found
/// in that directory points). The result is a hint for a later resolution
/// beneath the root, never opened on its own.
pub fn real_dir_path(root: BorrowedFd<'_>, rel: &Path) -> Result<PathBuf, Errno> {
    let mut names = Vec::new();
    walk(
        root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        &mut names,
    )?;
    Ok(names.iter().collect())
}
