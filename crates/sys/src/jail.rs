//! A jail for a program hako starts but does not trust to stay honest once
//! the code it hosts attacks it (a `vm` sandbox's QEMU): new mount,
//! network, IPC and UTS namespaces (and a user namespace when not run as
//! root), a root of its own holding only the paths it was given (read-only
//! unless said otherwise, each at the path it has on the host) and the
//! device nodes it needs, then, as root, an unprivileged uid and gid and
//! no capability; `no_new_privs` in every case.
//!
//! Everything is worked out by [`Jail::new`] in the parent; [`Jail::enter`]
//! runs in the forked child of a multi-threaded parent and so makes system
//! calls only: no allocation, no lock.
//!
//! The root is built as bubblewrap builds one: a tmpfs mounted on `/tmp`
//! becomes the root with the old one beneath it at `/oldroot`, the new
//! root is assembled at `/newroot` from `/oldroot/...`, and a second
//! `pivot_root` makes it the root, the old one then detached.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// What a jail holds.
#[derive(Debug, Clone, Default)]
pub struct JailSpec {
    /// Directories and files bound in at their host paths.
    pub binds: Vec<JailBind>,
    /// Symbolic links made inside (path, target), as the host has them
    /// (`/lib` to `usr/lib` on a merged-`/usr` system).
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// Device nodes bound in read-write at their host paths (under `/dev`).
    pub devices: Vec<PathBuf>,
    /// As root: the uid, gid and supplementary groups the program runs as
    /// (root's capabilities go with the uid). Ignored when not root (the
    /// program keeps the caller's uid, mapped into a user namespace).
    pub run_as: Option<(u32, u32, Vec<u32>)>,
    /// A file of this many bytes at [`RAM_FILE`], on a tmpfs of the jail's
    /// own (gone with its mount namespace), owned by the uid the program
    /// runs as: a VM's memory, which [`Jail::enter`] may fill from a
    /// snapshot.
    pub ram: Option<u64>,
    /// A seccomp filter installed last, after `no_new_privs`, just before
    /// the program is executed (which may stack its own on it).
    pub seccomp: Option<JailFilter>,
}

/// A compiled seccomp filter (classic-BPF instructions for this machine)
/// for [`JailSpec::seccomp`].
#[derive(Clone)]
pub struct JailFilter(pub std::sync::Arc<[libc::sock_filter]>);

impl std::fmt::Debug for JailFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "JailFilter({} instructions)", self.0.len())
    }
}

/// Where a jail's RAM file is ([`JailSpec::ram`]).
pub const RAM_FILE: &str = "/ram/mem";

/// One path bound into the jail.
#[derive(Debug, Clone)]
pub struct JailBind {
    /// The path, on the host and inside.
    pub path: PathBuf,
    /// Read-only inside.
    pub read_only: bool,
}

/// One step of building the root, ready to run.
#[derive(Debug)]
enum Step {
    Mkdir(CString),
    Touch(CString),
    Bind {
        source: CString,
        target: CString,
        /// The remount's flags: read-only and whatever the source's mount
        /// has that a remount must keep.
        remount: Option<libc::c_ulong>,
    },
    Symlink {
        target: CString,
        link: CString,
    },
}

/// A jail worked out, ready to [`enter`](Jail::enter).
#[derive(Debug)]
pub struct Jail {
    steps: Vec<Step>,
    root: bool,
    uid: libc::uid_t,
    gid: libc::gid_t,
    groups: Vec<libc::gid_t>,
    uid_map: CString,
    gid_map: CString,
    ram: Option<(u64, CString)>,
    seccomp: Option<JailFilter>,
}

fn c(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
}

fn c_path(prefix: &str, path: &Path) -> io::Result<CString> {
    let mut bytes = prefix.as_bytes().to_vec();
    bytes.extend_from_slice(path.as_os_str().as_bytes());
    c(&bytes)
}

/// `path` made of normal components under `/`, or an error naming it.
fn checked(path: &Path) -> io::Result<&Path> {
    let ok = path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && path != Path::new("/");
    if ok {
        Ok(path)
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} cannot be put in a jail", path.display()),
        ))
    }
}

impl Jail {
    /// Works out the steps for `spec`, checking each path on the host.
    pub fn new(spec: &JailSpec) -> io::Result<Jail> {
        let mut steps = Vec::new();
        let mut made: Vec<PathBuf> = Vec::new();
        let mut mkdirs = |path: &Path, steps: &mut Vec<Step>| -> io::Result<()> {
            let mut at = PathBuf::from("/");
            for part in path.components().skip(1) {
                at.push(part);
                if !made.contains(&at) {
                    made.push(at.clone());
                    steps.push(Step::Mkdir(c_path("/newroot", &at)?));
                }
            }
            Ok(())
        };
        steps.push(Step::Mkdir(c(b"/newroot/dev")?));
        for bind in &spec.binds {
            let path = checked(&bind.path)?;
            let meta = std::fs::metadata(path)?;
            if meta.is_dir() {
                mkdirs(path, &mut steps)?;
            } else {
                if let Some(parent) = path.parent().filter(|p| *p != Path::new("/")) {
                    mkdirs(parent, &mut steps)?;
                }
                steps.push(Step::Touch(c_path("/newroot", path)?));
            }
            let remount = bind
                .read_only
                .then(|| crate::mount::locked_flags(path))
                .transpose()?
                .map(|kept| {
                    libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | kept
                });
            steps.push(Step::Bind {
                source: c_path("/oldroot", path)?,
                target: c_path("/newroot", path)?,
                remount,
            });
        }
        for device in &spec.devices {
            let path = checked(device)?;
            if !path.starts_with("/dev") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{} is not under /dev", path.display()),
                ));
            }
            steps.push(Step::Touch(c_path("/newroot", path)?));
            steps.push(Step::Bind {
                source: c_path("/oldroot", path)?,
                target: c_path("/newroot", path)?,
                remount: None,
            });
        }
        for (link, target) in &spec.symlinks {
            let link = checked(link)?;
            if let Some(parent) = link.parent().filter(|p| *p != Path::new("/")) {
                mkdirs(parent, &mut steps)?;
            }
            steps.push(Step::Symlink {
                target: c(target.as_os_str().as_bytes())?,
                link: c_path("/newroot", link)?,
            });
        }
        // SAFETY: these calls only read the process's credentials.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        let root = euid == 0;
        let (uid, gid, groups) = match (&spec.run_as, root) {
            (Some((u, g, groups)), true) => (*u, *g, groups.clone()),
            _ => (euid, egid, Vec::new()),
        };
        Ok(Jail {
            steps,
            root,
            uid,
            gid,
            groups,
            uid_map: c(format!("{euid} {euid} 1\n").as_bytes())?,
            gid_map: c(format!("{egid} {egid} 1\n").as_bytes())?,
            ram: spec
                .ram
                .map(|size| {
                    Ok::<_, io::Error>((size, c(format!("size={size},mode=0755").as_bytes())?))
                })
                .transpose()?,
            seccomp: spec.seccomp.clone(),
        })
    }

    /// Builds the jail around the calling process (a forked child, just
    /// before exec): system calls only. `fd4`, if given, is first placed at
    /// descriptor 4 (kept across exec). `ram_from`: a file whose data the
    /// RAM file gets (its holes stay holes).
    pub fn enter(
        &self,
        fd4: Option<std::os::fd::RawFd>,
        ram_from: Option<std::os::fd::RawFd>,
    ) -> io::Result<()> {
        fn check(ret: libc::c_int) -> io::Result<()> {
            if ret < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        let null = std::ptr::null::<libc::c_char>();
        // SAFETY: system calls on NUL-terminated strings this jail owns
        // (or literals), which outlive each call; nothing is allocated.
        unsafe {
            if let Some(fd) = fd4 {
                // dup2 leaves the copy without close-on-exec; onto itself
                // it would not clear it.
                if fd == 4 {
                    check(libc::fcntl(4, libc::F_SETFD, 0))?;
                } else if libc::dup2(fd, 4) != 4 {
                    return Err(io::Error::last_os_error());
                }
            }
            let mut flags =
                libc::CLONE_NEWNS | libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
            if !self.root {
                flags |= libc::CLONE_NEWUSER;
            }
            check(libc::unshare(flags))?;
            if !self.root {
                write_file(c"/proc/self/setgroups", c"deny")?;
                write_file(c"/proc/self/uid_map", &self.uid_map)?;
                write_file(c"/proc/self/gid_map", &self.gid_map)?;
            }
            check(libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_SLAVE | libc::MS_REC,
                null.cast(),
            ))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                c"/tmp".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=1m".as_ptr().cast(),
            ))?;
            check(libc::chdir(c"/tmp".as_ptr()))?;
            check(libc::mkdir(c"newroot".as_ptr(), 0o755))?;
            check(libc::mkdir(c"oldroot".as_ptr(), 0o755))?;
            check(
                libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c"oldroot".as_ptr())
                    as libc::c_int,
            )?;
            check(libc::chdir(c"/".as_ptr()))?;
            check(libc::mount(
                c"tmpfs".as_ptr(),
                c"/newroot".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                c"mode=0755,size=1m".as_ptr().cast(),
            ))?;
            for step in &self.steps {
                match step {
                    Step::Mkdir(path) => {
                        if libc::mkdir(path.as_ptr(), 0o755) != 0
                            && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST)
                        {
                            return Err(io::Error::last_os_error());
                        }
                    }
                    Step::Touch(path) => {
                        let fd = libc::open(
                            path.as_ptr(),
                            libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                            0o644,
                        );
                        check(fd)?;
                        libc::close(fd);
                    }
                    Step::Bind {
                        source,
                        target,
                        remount,
                    } => {
                        check(libc::mount(
                            source.as_ptr(),
                            target.as_ptr(),
                            null,
                            libc::MS_BIND,
                            null.cast(),
                        ))?;
                        if let Some(flags) = remount {
                            check(libc::mount(
                                null,
                                target.as_ptr(),
                                null,
                                *flags,
                                null.cast(),
                            ))?;
                        }
                    }
                    Step::Symlink { target, link } => {
                        check(libc::symlink(target.as_ptr(), link.as_ptr()))?;
                    }
                }
            }
            if let Some((size, options)) = &self.ram {
                check(libc::mkdir(c"/newroot/ram".as_ptr(), 0o755))?;
                check(libc::mount(
                    c"tmpfs".as_ptr(),
                    c"/newroot/ram".as_ptr(),
                    c"tmpfs".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    options.as_ptr().cast(),
                ))?;
                let fd = libc::open(
                    c"/newroot/ram/mem".as_ptr(),
                    libc::O_CREAT | libc::O_RDWR | libc::O_CLOEXEC,
                    0o600,
                );
                check(fd)?;
                let filled = fill_ram(fd, *size, ram_from, self.uid, self.gid);
                libc::close(fd);
                filled?;
            }
            check(libc::chdir(c"/newroot".as_ptr()))?;
            check(
                libc::syscall(libc::SYS_pivot_root, c".".as_ptr(), c".".as_ptr()) as libc::c_int,
            )?;
            check(libc::umount2(c".".as_ptr(), libc::MNT_DETACH))?;
            check(libc::chdir(c"/".as_ptr()))?;
            // The root itself read-only from here.
            check(libc::mount(
                null,
                c"/".as_ptr(),
                null,
                libc::MS_BIND
                    | libc::MS_REMOUNT
                    | libc::MS_RDONLY
                    | libc::MS_NOSUID
                    | libc::MS_NODEV,
                null.cast(),
            ))?;
            if self.root {
                check(libc::setgroups(self.groups.len(), self.groups.as_ptr()))?;
                check(libc::setresgid(self.gid, self.gid, self.gid))?;
                // Every capability goes with uid 0.
                check(libc::setresuid(self.uid, self.uid, self.uid))?;
            }
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))?;
        }
        if let Some(filter) = &self.seccomp {
            crate::raw::seccomp_set_mode_filter(&filter.0)?;
        }
        Ok(())
    }
}

/// Sizes the RAM file `fd`, hands it to `uid`/`gid`, and copies into it
/// the data of `from` (extent by extent: its holes stay holes), with
/// system calls only.
fn fill_ram(
    fd: libc::c_int,
    size: u64,
    from: Option<libc::c_int>,
    uid: libc::uid_t,
    gid: libc::gid_t,
) -> io::Result<()> {
    let size =
        libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: system calls on descriptors open for the call's length, and
    // on a local offset.
    unsafe {
        if libc::ftruncate(fd, size) != 0 || libc::fchown(fd, uid, gid) != 0 {
            return Err(io::Error::last_os_error());
        }
        let Some(from) = from else {
            return Ok(());
        };
        let mut at: libc::off_t = 0;
        while at < size {
            let data = libc::lseek(from, at, libc::SEEK_DATA);
            if data < 0 {
                // ENXIO: no data past `at`.
                if io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
                    break;
                }
                return Err(io::Error::last_os_error());
            }
            let hole = libc::lseek(from, data, libc::SEEK_HOLE);
            if hole < 0 {
                return Err(io::Error::last_os_error());
            }
            let end = hole.min(size);
            if libc::lseek(fd, data, libc::SEEK_SET) < 0 {
                return Err(io::Error::last_os_error());
            }
            let mut offset = data;
            while offset < end {
                let n = libc::sendfile(fd, from, &mut offset, (end - offset) as usize);
                if n < 0 {
                    if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    return Err(io::Error::last_os_error());
                }
                if n == 0 {
                    return Err(io::Error::from_raw_os_error(libc::EIO));
                }
            }
            at = end;
        }
    }
    Ok(())
}

/// Writes `data` to `path` with system calls only.
fn write_file(path: &std::ffi::CStr, data: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let bytes = data.to_bytes();
    // SAFETY: `bytes` lives for the call; `fd` is open.
    let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    if n < 0 || n as usize != bytes.len() {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn paths_that_are_not_plain_absolute_ones_are_refused() {
        for bad in ["relative", "/a/../etc", "/"] {
            let spec = JailSpec {
                binds: vec![JailBind {
                    path: PathBuf::from(bad),
                    read_only: true,
                }],
                ..JailSpec::default()
            };
            assert!(Jail::new(&spec).is_err(), "{bad}");
        }
        let spec = JailSpec {
            devices: vec![PathBuf::from("/etc/passwd")],
            ..JailSpec::default()
        };
        assert!(Jail::new(&spec).is_err());
    }

    #[test]
    fn parents_are_made_once_and_before_what_they_hold() {
        let spec = JailSpec {
            binds: vec![
                JailBind {
                    path: PathBuf::from("/usr"),
                    read_only: true,
                },
                JailBind {
                    path: PathBuf::from("/usr/bin"),
                    read_only: true,
                },
            ],
            ..JailSpec::default()
        };
        let jail = Jail::new(&spec).unwrap();
        let mkdirs: Vec<&str> = jail
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Mkdir(p) => p.to_str().ok(),
                _ => None,
            })
            .collect();
        assert_eq!(mkdirs, ["/newroot/dev", "/newroot/usr", "/newroot/usr/bin"]);
    }
}
