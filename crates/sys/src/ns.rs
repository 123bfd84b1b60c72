//! Namespaces and process attributes for the `linux` backend's launcher.
//!
//! These are called by `hako-guest`, a single-threaded process, while it
//! builds a sandbox: unshare the namespaces, map its uid and gid, fork the
//! sandbox's pid 1, name the host and bring up loopback.

use std::ffi::CString;
use std::io;

pub use libc::{
    CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWNS, CLONE_NEWPID, CLONE_NEWUSER,
    CLONE_NEWUTS,
};

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Moves the calling process into new namespaces (`CLONE_NEW*` flags).
///
/// `CLONE_NEWUSER` requires a single-threaded caller; `CLONE_NEWPID` affects
/// the caller's children, not the caller.
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes an integer; it changes only this process's
    // namespace membership (the caller is single-threaded, see above).
    cvt(unsafe { libc::unshare(flags) }).map(drop)
}

fn write_proc(pid: &str, name: &str, contents: &str) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/{name}"), contents)
}

/// Maps one uid and one gid of the new user namespace onto the caller's
/// (`inner outer 1`), after denying `setgroups` (which an unprivileged
/// process must do before it may write a gid map).
pub fn write_id_maps(uid: (u32, u32), gid: (u32, u32)) -> io::Result<()> {
    write_maps("self", uid, gid)
}

/// Like [`write_id_maps`], for the new user namespace of process `pid`,
/// written from its parent's namespace (by its parent).
pub fn write_id_maps_of(pid: i32, uid: (u32, u32), gid: (u32, u32)) -> io::Result<()> {
    write_maps(&pid.to_string(), uid, gid)
}

fn write_maps(pid: &str, uid: (u32, u32), gid: (u32, u32)) -> io::Result<()> {
    match write_proc(pid, "setgroups", "deny") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        other => other?,
    }
    write_proc(pid, "uid_map", &format!("{} {} 1\n", uid.0, uid.1))?;
    write_proc(pid, "gid_map", &format!("{} {} 1\n", gid.0, gid.1))
}

/// The result of [`fork_single_threaded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// In the parent, with the child's pid.
    Parent(i32),
    /// In the child.
    Child,
}

fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Proof, checked once, that the process had a single thread. It cannot be
/// sent to another thread; the caller promises not to start threads while
/// holding it.
#[derive(Debug)]
pub struct SingleThreaded {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// Checks that the calling process has exactly one thread (read from
/// `/proc/self/task`, so call it before entering another mount namespace).
pub fn single_threaded() -> io::Result<SingleThreaded> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "the process has {threads} threads; fork and user namespaces need one"
        )));
    }
    Ok(SingleThreaded {
        _not_send: std::marker::PhantomData,
    })
}

/// `fork()` in a process proven single-threaded (in a multi-threaded one the
/// child could inherit locks held by threads that no longer exist).
pub fn fork_single_threaded(_proof: &SingleThreaded) -> io::Result<Forked> {
    // SAFETY: the process is single-threaded (the proof), so the child is a
    // complete copy with no lock held by a vanished thread.
    let pid = cvt(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid)
    })
}

/// `fork()` into new namespaces: the child starts in the namespaces that
/// `flags` (`CLONE_NEW*`) create, its parent stays where it was. With
/// `CLONE_NEWPID` the child is pid 1 of the new pid namespace.
pub fn fork_into_namespaces(_proof: &SingleThreaded, flags: libc::c_int) -> io::Result<Forked> {
    let flags = libc::c_ulong::try_from(flags | libc::SIGCHLD).map_err(io::Error::other)?;
    // SAFETY: clone without CLONE_VM and without a new stack behaves as
    // fork(): the child gets a copy of the address space and returns here.
    // The process is single-threaded (the proof), so the copy holds no lock
    // of a vanished thread. glibc caches no pid since 2.25.
    let pid = unsafe { libc::syscall(libc::SYS_clone, flags, 0usize, 0usize, 0usize, 0usize) };
    let pid = i32::try_from(pid).map_err(io::Error::other)?;
    let pid = cvt(pid)?;
    Ok(if pid == 0 {
        Forked::Child
    } else {
        Forked::Parent(pid)
    })
}

/// Asks the kernel to SIGKILL this process when its parent exits.
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) }).map(drop)
}

/// Makes this process non-dumpable: its `/proc/PID` files become owned by
/// root and it cannot be ptraced by processes of the same uid.
pub fn set_not_dumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) }).map(drop)
}

/// Sets the host name (in the caller's UTS namespace).
pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`'s bytes, which outlive
    // the call; the kernel only reads them.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Brings up the loopback interface of the caller's network namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes integers and returns a new descriptor.
    let sock =
        cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `ifreq` is plain data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq for both ioctls; `sock` is our socket.
    let result = unsafe {
        cvt(libc::ioctl(sock, libc::SIOCGIFFLAGS, &mut req)).and_then(|_| {
            req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
            cvt(libc::ioctl(sock, libc::SIOCSIFFLAGS, &req))
        })
    };
    // SAFETY: closing the socket we opened above.
    unsafe { libc::close(sock) };
    result.map(drop)
}

/// A network namespace being made, with loopback up, on a thread of its
/// own (see [`NetworkNamespace::make_aside`]).
#[derive(Debug)]
pub struct NetworkNamespace {
    maker: std::thread::JoinHandle<io::Result<std::os::fd::OwnedFd>>,
}

impl NetworkNamespace {
    /// Starts making a new network namespace, owned by the caller's user
    /// namespace, with its loopback interface up, on a new thread; the
    /// caller goes on meanwhile. Making one is most of the kernel's work in
    /// making a sandbox (every per-namespace table and sysctl is set up),
    /// and this lets it overlap the caller's own work.
    ///
    /// Namespaces belong to threads: only the new thread is in it until
    /// [`enter`](Self::enter). The caller must not fork before `enter` (the
    /// child would inherit a lock the thread may hold); `enter` joins the
    /// thread.
    pub fn make_aside() -> io::Result<Self> {
        let maker = std::thread::Builder::new()
            .name("hako-netns".into())
            .spawn(|| {
                unshare(libc::CLONE_NEWNET)?;
                loopback_up()?;
                let fd = rustix::fs::open(
                    "/proc/thread-self/ns/net",
                    rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                    rustix::fs::Mode::empty(),
                )?;
                Ok(fd)
            })?;
        Ok(NetworkNamespace { maker })
    }

    /// Waits for the namespace and moves the calling thread into it (call
    /// it from the thread that forks the sandbox's processes, which then
    /// start there). Afterwards the process has the threads it had before
    /// `make_aside`.
    pub fn enter(self) -> io::Result<()> {
        let fd = self
            .maker
            .join()
            .map_err(|_| io::Error::other("the thread making it panicked"))??;
        // SAFETY: setns takes a descriptor we own and an integer flag; it
        // changes only the calling thread's network namespace.
        cvt(unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::CLONE_NEWNET) })
            .map(drop)
    }
}

/// Whether unprivileged user namespaces are enabled, with the reason when
/// they are not (read from the sysctls that govern them).
pub fn user_namespaces_allowed() -> Result<(), String> {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    if read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        return Err("kernel.unprivileged_userns_clone=0; hint: sysctl -w kernel.unprivileged_userns_clone=1".into());
    }
    if read("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return Err(
            "user.max_user_namespaces=0; hint: sysctl -w user.max_user_namespaces=15000".into(),
        );
    }
    if read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") {
        return Err("AppArmor restricts unprivileged user namespaces (kernel.apparmor_restrict_unprivileged_userns=1); hint: add an AppArmor profile for hako with `userns,` or set the sysctl to 0".into());
    }
    match try_user_namespace() {
        Ok(()) => Ok(()),
        Err(errno) => Err(why_no_user_namespace(
            errno,
            seccomp_filtered(),
            in_container(),
        )),
    }
}

/// Whether this process runs under a seccomp filter (`Seccomp: 2` in
/// `/proc/self/status`).
pub fn seccomp_filtered() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Seccomp:") && l.split_whitespace().nth(1) == Some("2"))
    })
}

/// Whether this process seems to run in a container (Docker's
/// `/.dockerenv`, Podman's `/run/.containerenv`, a Kubernetes service
/// account, or a container runtime named in its cgroup).
pub fn in_container() -> bool {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    std::path::Path::new("/.dockerenv").exists()
        || std::path::Path::new("/run/.containerenv").exists()
        || std::path::Path::new("/var/run/secrets/kubernetes.io").exists()
        || ["docker", "kubepods", "containerd", "libpod"]
            .iter()
            .any(|c| cgroup.contains(c))
}

/// Why creating a user namespace failed with `errno`, and what to do.
pub fn why_no_user_namespace(errno: i32, seccomp: bool, container: bool) -> String {
    match errno {
        libc::EPERM if seccomp && container => "creating a user namespace is refused (EPERM) by this container's seccomp filter (Docker's default profile refuses it without CAP_SYS_ADMIN); hint: use --backend landlock, which needs no namespace, or run the container with --security-opt seccomp=unconfined (hako installs its own filter)".into(),
        libc::EPERM if seccomp => "creating a user namespace is refused (EPERM) by a seccomp filter on this process; hint: use --backend landlock, or run hako without the filter".into(),
        libc::EPERM => "creating a user namespace is refused (EPERM) by a security module or the kernel's settings; hint: use --backend landlock".into(),
        libc::ENOSPC => "the user namespace limit is reached (user.max_user_namespaces); hint: raise it with sysctl, or use --backend landlock".into(),
        libc::EINVAL | libc::ENOSYS => "this kernel has no user namespaces (CONFIG_USER_NS); hint: use --backend landlock".into(),
        other => format!(
            "creating a user namespace failed: {}; hint: use --backend landlock",
            io::Error::from_raw_os_error(other)
        ),
    }
}

/// Tries `unshare(CLONE_NEWUSER)` in a child process, which then exits:
/// the caller is left as it was. The errno on failure.
fn try_user_namespace() -> Result<(), i32> {
    // SAFETY: the child calls only async-signal-safe functions (unshare,
    // __errno_location through `errno`, _exit) before it exits, so forking
    // a multi-threaded caller is sound; the parent waits for it.
    unsafe {
        match libc::fork() {
            -1 => Err(*libc::__errno_location()),
            0 => {
                let code = if libc::unshare(libc::CLONE_NEWUSER) == 0 {
                    0
                } else {
                    (*libc::__errno_location()).clamp(1, 255)
                };
                libc::_exit(code)
            }
            pid => {
                let mut status = 0;
                while libc::waitpid(pid, &mut status, 0) == -1 {
                    if *libc::__errno_location() != libc::EINTR {
                        return Err(libc::ECHILD);
                    }
                }
                match libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)) {
                    Some(0) => Ok(()),
                    Some(errno) => Err(errno),
                    None => Err(libc::ECHILD),
                }
            }
        }
    }
}

/// The path of a C string, for messages.
pub fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in string"))
}

/// Joins the namespaces (`CLONE_NEW*` flags) of the process `pid`, all at
/// once and race-free through a pidfd (Linux 5.8). Joining a user namespace
/// requires a single-threaded caller.
pub fn enter_namespaces_of(pid: i32, flags: libc::c_int) -> io::Result<()> {
    let pid = rustix::process::Pid::from_raw(pid)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid 0"))?;
    let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    // SAFETY: setns takes a descriptor we own and integer flags; it changes
    // only this (single-threaded) process's namespace membership.
    cvt(unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&pidfd), flags) }).map(drop)
}
