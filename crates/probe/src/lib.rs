//! `hako-probe`: reports, as one JSON object on stdout, what the process it
//! runs in may do. Copy it into a sandbox and run it there; compare with a
//! run outside.
//!
//! # Usage
//!
//! - `hako-probe`: run every check and print the report.
//! - `hako-probe --apply-default-seccomp`: first set `no_new_privs` and
//!   install [`hako_seccomp::default_policy`] on itself, then report (how the
//!   tests check the filter without a sandbox).
//! - `hako-probe --single unshare-newuser` and `--single noop`: internal,
//!   run by the probe in a child process.
//!
//! # Report
//!
//! ```text
//! {
//!   "arch": "x86_64",
//!   "applied_default_seccomp": false,
//!   "status": {"CapInh": "0000000000000000", "CapPrm": "…", "CapEff": "…",
//!              "CapBnd": "…", "CapAmb": "…", "NoNewPrivs": "0",
//!              "Seccomp": "0", "Seccomp_filters": "0"},   // raw /proc/self/status
//!   "uid": 0, "euid": 0, "gid": 0, "egid": 0,
//!   "hostname": "…",
//!   "syscalls": { "<check>": CHECK, … },
//!   "behaviour": {
//!     "unshare_newuser": CALL,      // a real unshare(CLONE_NEWUSER), in a child process
//!     "personality_query": CALL,    // personality(0xffffffff): must stay allowed
//!     "tiocsti_fd0": CALL,          // ioctl(0, TIOCSTI, BAD_ADDRESS): nothing can be injected
//!     "thread": RUN,                // std::thread::spawn + join
//!     "spawn_self": RUN,            // fork + exec of this probe (`--single noop`)
//!     "shell_background_job": RUN   // /bin/sh -c 'true & wait'
//!   }
//! }
//! CHECK = {"syscall": "mount", "args": ["0x…", …6], "ret": null | N,
//!          "errno": null | N, "error": null | "EFAULT",
//!          "allowed_looks_like": "EFAULT",
//!          "kernel_may_refuse": "never" | "unprivileged" | "host_config",
//!          "policy": "EPERM" | "ENOSYS" | "allow",
//!          "refused": true | false}
//! CALL  = {"ret": null | N, "errno": null | N, "error": null | "EPERM"}
//! RUN   = {"ok": true | false, "error": null | "…"}
//! ```
//!
//! A `CHECK` calls one system call the default policy refuses, with
//! arguments chosen so that, if the call reaches the kernel, the kernel
//! fails it harmlessly with another error (`allowed_looks_like`), before
//! acting. `policy` is what [`hako_seccomp::default_policy`] does with these
//! arguments (x32 calls: `ENOSYS`, see [`hako_seccomp::compile`]), and
//! `refused` says the call failed with exactly that errno. Without a filter
//! the kernel may itself answer `EPERM` before looking at the arguments:
//! `kernel_may_refuse` is `unprivileged` where it does so for a caller
//! without the capability, and `host_config` where even root may get it
//! (a sysctl, kernel lockdown, or the feature not built). See [`checks`] for
//! every check and what "allowed" looks like.
//!
//! The probe is safe to run unfiltered as root: every pointer argument is
//! null or [`BAD_ADDRESS`], every flag set is invalid or every id
//! nonexistent, so each call fails before it acts; the one call that would
//! act (`personality` with `ADDR_NO_RANDOMIZE`) is undone at once.

pub mod steal;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use hako_seccomp::{
    default_policy, Action, Arch, Policy, ADDR_NO_RANDOMIZE, NAMESPACE_FLAGS, PERSONALITY_QUERY,
    TIOCLINUX, TIOCSTI,
};
use hako_sys::raw::{syscall_ints, SyscallError, BAD_ADDRESS};
use serde_json::{json, Map, Value};

/// When the kernel itself, without any filter, may answer `EPERM` (or
/// `ENOSYS`) to a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelMayRefuse {
    /// Never: the arguments fail before any permission check.
    Never,
    /// For a caller without the capability the call needs.
    Unprivileged,
    /// Even for root, on some hosts: a sysctl, kernel lockdown, or the
    /// feature compiled out (or, for x32, an ABI the kernel lacks).
    HostConfig,
}

impl KernelMayRefuse {
    fn as_str(self) -> &'static str {
        match self {
            KernelMayRefuse::Never => "never",
            KernelMayRefuse::Unprivileged => "unprivileged",
            KernelMayRefuse::HostConfig => "host_config",
        }
    }
}

/// How a check calls its system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// `syscall(nr, args…)` once.
    Plain,
    /// The x32-ABI number of the system call (x86_64 only).
    X32,
    /// `personality(current | ADDR_NO_RANDOMIZE)`, then restore `current`.
    PersonalitySetAndRestore,
}

/// One system call the probe makes.
#[derive(Debug, Clone)]
pub struct Check {
    /// Key in the report.
    pub name: String,
    /// The system call.
    pub syscall: &'static str,
    /// Its arguments.
    pub args: [u64; 6],
    /// The result if the call reaches the kernel.
    pub allowed_looks_like: &'static str,
    /// When the kernel itself may refuse it.
    pub kernel_may_refuse: KernelMayRefuse,
    /// How it is called.
    pub how: How,
}

/// `-1` as a descriptor or id argument.
const MINUS_1: u64 = u64::MAX;
/// A flag bit no call the probe makes accepts.
const BAD_FLAG: u64 = 0x4000_0000;
/// `UMOUNT_UNUSED`: the kernel reserves it to be rejected.
const UMOUNT_UNUSED: u64 = 0x8000_0000;
/// An unshare flag unshare rejects (`CLONE_PARENT`).
const CLONE_PARENT: u64 = 0x8000;
/// `CLONE_THREAD`: without `CLONE_SIGHAND` clone rejects it first.
const CLONE_THREAD: u64 = 0x0001_0000;
/// A clock id past the last one.
const BAD_CLOCK: u64 = 1000;
/// `RLIMIT_NOFILE`.
const RLIMIT_NOFILE: u64 = 7;
const PTRACE_PEEKDATA: u64 = 2;
const UFFD_USER_MODE_ONLY: u64 = 1;
/// A `keyctl` operation that does not exist.
const BAD_KEYCTL: u64 = 0xffff;
/// A `bpf` command that does not exist.
const BAD_BPF_CMD: u64 = 0xffff;
/// `sizeof(struct clone_args)` (version 2).
const CLONE_ARGS_SIZE: u64 = 88;

fn check(
    name: &str,
    syscall: &'static str,
    args: [u64; 6],
    allowed_looks_like: &'static str,
    kernel_may_refuse: KernelMayRefuse,
) -> Check {
    Check {
        name: name.to_owned(),
        syscall,
        args,
        allowed_looks_like,
        kernel_may_refuse,
        how: How::Plain,
    }
}

/// Every system call check, for `arch`. The comments give the kernel's first
/// test the arguments fail.
pub fn checks(arch: Arch) -> Vec<Check> {
    use KernelMayRefuse::{HostConfig, Never, Unprivileged};
    const B: u64 = BAD_ADDRESS;
    let mut out = vec![
        // Copying the device name from BAD_ADDRESS faults.
        check("mount", "mount", [B, B, B, 0, B, 0], "EFAULT", Never),
        // Unknown flags are rejected before the path is looked up.
        check(
            "umount2",
            "umount2",
            [B, UMOUNT_UNUSED, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        // may_mount() first (EPERM unprivileged), then the path faults.
        check(
            "pivot_root",
            "pivot_root",
            [B, B, 0, 0, 0, 0],
            "EFAULT",
            Unprivileged,
        ),
        check(
            "move_mount",
            "move_mount",
            [MINUS_1, B, MINUS_1, B, BAD_FLAG, 0],
            "EINVAL",
            Unprivileged,
        ),
        check(
            "open_tree",
            "open_tree",
            [MINUS_1, B, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        check(
            "fsopen",
            "fsopen",
            [B, BAD_FLAG, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        check(
            "fsmount",
            "fsmount",
            [MINUS_1, BAD_FLAG, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // A negative descriptor is EINVAL before anything else.
        check(
            "fsconfig",
            "fsconfig",
            [MINUS_1, 0, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        check(
            "fspick",
            "fspick",
            [MINUS_1, B, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        check(
            "mount_setattr",
            "mount_setattr",
            [MINUS_1, B, BAD_FLAG, B, 0, 0],
            "EINVAL",
            Never,
        ),
        // Linux 6.15 and later; ENOSYS before.
        check(
            "open_tree_attr",
            "open_tree_attr",
            [MINUS_1, B, BAD_FLAG, B, 0, 0],
            "EINVAL",
            HostConfig,
        ),
    ];
    for &(ns, flag) in NAMESPACE_FLAGS {
        // CLONE_PARENT is not an unshare flag: EINVAL before anything.
        out.push(check(
            &format!("unshare_{ns}"),
            "unshare",
            [flag | CLONE_PARENT, 0, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ));
        if ns != "newtime" {
            // CLONE_THREAD without CLONE_SIGHAND: EINVAL before a task is copied.
            out.push(check(
                &format!("clone_{ns}"),
                "clone",
                [flag | CLONE_THREAD, 0, 0, 0, 0, 0],
                "EINVAL",
                Never,
            ));
        }
    }
    out.extend([
        // Copying struct clone_args from BAD_ADDRESS faults.
        check(
            "clone3",
            "clone3",
            [B, CLONE_ARGS_SIZE, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        check("setns", "setns", [MINUS_1, 0, 0, 0, 0, 0], "EBADF", Never),
        check(
            "keyctl",
            "keyctl",
            [BAD_KEYCTL, 0, 0, 0, 0, 0],
            "EOPNOTSUPP",
            Never,
        ),
        // Copying the key type from BAD_ADDRESS faults.
        check("add_key", "add_key", [B, B, 0, 0, 0, 0], "EFAULT", Never),
        check(
            "request_key",
            "request_key",
            [B, B, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        // Older kernels refuse unprivileged bpf before the command.
        check(
            "bpf",
            "bpf",
            [BAD_BPF_CMD, 0, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // Copying the attributes from BAD_ADDRESS faults.
        check(
            "perf_event_open",
            "perf_event_open",
            [B, 0, MINUS_1, MINUS_1, 0, 0],
            "EFAULT",
            Never,
        ),
        // No process has pid 0.
        check(
            "ptrace",
            "ptrace",
            [PTRACE_PEEKDATA, 0, 0, 0, 0, 0],
            "ESRCH",
            Never,
        ),
        // flags must be 0.
        check(
            "process_vm_readv",
            "process_vm_readv",
            [0, 0, 0, 0, 0, 1],
            "EINVAL",
            Never,
        ),
        check(
            "process_vm_writev",
            "process_vm_writev",
            [0, 0, 0, 0, 0, 1],
            "EINVAL",
            Never,
        ),
        // Unknown flags are refused before the pidfd is looked at.
        check(
            "pidfd_getfd",
            "pidfd_getfd",
            [MINUS_1, 0, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        // UFFD_USER_MODE_ONLY passes the privilege test (Linux 5.11 and
        // later), then the unknown flag is EINVAL.
        check(
            "userfaultfd",
            "userfaultfd",
            [UFFD_USER_MODE_ONLY | BAD_FLAG, 0, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // kernel.io_uring_disabled may refuse first.
        check(
            "io_uring_setup",
            "io_uring_setup",
            [0, B, 0, 0, 0, 0],
            "EFAULT",
            HostConfig,
        ),
        check(
            "io_uring_enter",
            "io_uring_enter",
            [MINUS_1, 0, 0, 0, 0, 0],
            "EBADF",
            Never,
        ),
        // Descriptor -1 means "no ring" since 6.13, where opcode 0 is EINVAL.
        check(
            "io_uring_register",
            "io_uring_register",
            [MINUS_1, 0, 0, 0, 0, 0],
            "EINVAL (EBADF before 6.13)",
            Never,
        ),
        // CAP_SYS_BOOT, kernel.kexec_load_disabled and lockdown first; then
        // too many segments and an unknown architecture.
        check(
            "kexec_load",
            "kexec_load",
            [0, 0xffff_ffff, 0, BAD_FLAG, 0, 0],
            "EINVAL",
            HostConfig,
        ),
        check(
            "kexec_file_load",
            "kexec_file_load",
            [MINUS_1, MINUS_1, 0, B, BAD_FLAG, 0],
            "EINVAL",
            HostConfig,
        ),
        // CAP_SYS_MODULE and kernel.modules_disabled first; then an image
        // of length 0 is not an ELF file.
        check(
            "init_module",
            "init_module",
            [B, 0, B, 0, 0, 0],
            "ENOEXEC",
            HostConfig,
        ),
        check(
            "finit_module",
            "finit_module",
            [MINUS_1, B, BAD_FLAG, 0, 0, 0],
            "EINVAL",
            HostConfig,
        ),
        check(
            "delete_module",
            "delete_module",
            [B, 0, 0, 0, 0, 0],
            "EFAULT",
            HostConfig,
        ),
        // Copying the handle faults (or, on some versions, descriptor -1 is EBADF first).
        check(
            "open_by_handle_at",
            "open_by_handle_at",
            [MINUS_1, B, 0, 0, 0, 0],
            "EFAULT or EBADF",
            Unprivileged,
        ),
        // CAP_SYS_BOOT first; then the magic numbers are wrong.
        check(
            "reboot",
            "reboot",
            [0, 0, 0, 0, 0, 0],
            "EINVAL",
            Unprivileged,
        ),
        // Unknown swap flags are EINVAL before the capability test.
        check(
            "swapon",
            "swapon",
            [B, BAD_FLAG, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        check(
            "swapoff",
            "swapoff",
            [B, 0, 0, 0, 0, 0],
            "EFAULT",
            Unprivileged,
        ),
        // A non-null name: accounting is never turned off.
        check("acct", "acct", [B, 0, 0, 0, 0, 0], "EFAULT", Unprivileged),
        check(
            "settimeofday",
            "settimeofday",
            [B, 0, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        check(
            "clock_settime",
            "clock_settime",
            [BAD_CLOCK, B, 0, 0, 0, 0],
            "EINVAL",
            Never,
        ),
        // The struct is copied in (and faults) before the clock is looked up.
        check(
            "clock_adjtime",
            "clock_adjtime",
            [BAD_CLOCK, B, 0, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        check("adjtimex", "adjtimex", [B, 0, 0, 0, 0, 0], "EFAULT", Never),
        // On descriptor -1 the request is never looked at.
        check(
            "ioctl_tiocsti",
            "ioctl",
            [MINUS_1, TIOCSTI, B, 0, 0, 0],
            "EBADF",
            Never,
        ),
        check(
            "ioctl_tiocsti_high_bits",
            "ioctl",
            [MINUS_1, TIOCSTI | 0xffff_ffff_0000_0000, B, 0, 0, 0],
            "EBADF",
            Never,
        ),
        check(
            "ioctl_tioclinux",
            "ioctl",
            [MINUS_1, TIOCLINUX, B, 0, 0, 0],
            "EBADF",
            Never,
        ),
        // The new limits are copied in (and fault) before the process is
        // looked up: nothing is changed.
        check(
            "prlimit64_of_another_process",
            "prlimit64",
            [1, RLIMIT_NOFILE, B, 0, 0, 0],
            "EFAULT",
            Never,
        ),
        Check {
            name: "personality_addr_no_randomize".into(),
            syscall: "personality",
            args: [ADDR_NO_RANDOMIZE, 0, 0, 0, 0, 0],
            allowed_looks_like: "the previous persona (the change is undone at once)",
            kernel_may_refuse: Never,
            how: How::PersonalitySetAndRestore,
        },
    ]);
    if arch == Arch::X86_64 {
        out.push(Check {
            name: "x32_mount".into(),
            syscall: "mount",
            args: [0; 6],
            allowed_looks_like: "EFAULT (ENOSYS: the kernel has no x32 ABI)",
            kernel_may_refuse: HostConfig,
            how: How::X32,
        });
    }
    out
}

/// The outcome of one raw call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It returned this value.
    Ret(i64),
    /// It failed with this errno.
    Errno(i32),
    /// `hako_sys::raw::syscall_ints` declined it (a bug in the probe).
    NotMade(&'static str),
    /// The system call does not exist on this architecture.
    NoSuchCall,
}

impl Outcome {
    fn from_result(result: Result<i64, SyscallError>) -> Self {
        match result {
            Ok(ret) => Outcome::Ret(ret),
            Err(SyscallError::Errno(errno)) => Outcome::Errno(errno),
            Err(SyscallError::NotSound(why)) => Outcome::NotMade(why),
        }
    }

    fn to_json(self) -> Map<String, Value> {
        let mut map = Map::new();
        let (ret, errno) = match self {
            Outcome::Ret(ret) => (json!(ret), Value::Null),
            Outcome::Errno(errno) => (Value::Null, json!(errno)),
            Outcome::NotMade(why) => {
                map.insert("not_made".into(), json!(why));
                (Value::Null, Value::Null)
            }
            Outcome::NoSuchCall => {
                map.insert("not_made".into(), json!("no such system call here"));
                (Value::Null, Value::Null)
            }
        };
        map.insert("ret".into(), ret);
        map.insert("errno".into(), errno);
        let error = match self {
            Outcome::Errno(errno) => json!(errno_name(errno)),
            _ => Value::Null,
        };
        map.insert("error".into(), error);
        map
    }
}

fn raw(nr: Option<i64>, args: [u64; 6]) -> Outcome {
    match nr {
        Some(nr) => Outcome::from_result(syscall_ints(nr, args)),
        None => Outcome::NoSuchCall,
    }
}

/// Runs one check and returns its outcome and the arguments actually used.
pub fn run_check(arch: Arch, check: &Check) -> (Outcome, [u64; 6]) {
    let nr = arch.syscall_number(check.syscall);
    match check.how {
        How::Plain => (raw(nr, check.args), check.args),
        How::X32 => (
            raw(nr.map(|nr| nr | hako_sys::raw::X32_SYSCALL_BIT), check.args),
            check.args,
        ),
        How::PersonalitySetAndRestore => {
            let current = match raw(nr, [PERSONALITY_QUERY, 0, 0, 0, 0, 0]) {
                Outcome::Ret(p) => p as u64 & 0xffff_ffff,
                other => return (other, check.args),
            };
            let args = [current | ADDR_NO_RANDOMIZE, 0, 0, 0, 0, 0];
            let outcome = raw(nr, args);
            if let Outcome::Ret(_) = outcome {
                // Allowed: put the persona back before anything is executed.
                let _ = raw(nr, [current, 0, 0, 0, 0, 0]);
            }
            (outcome, args)
        }
    }
}

/// The errno the policy answers a check with (`None`: allowed).
pub fn policy_errno(policy: &Policy, check: &Check, args: &[u64; 6]) -> Option<i32> {
    if check.how == How::X32 {
        return Some(libc::ENOSYS);
    }
    match policy.action_for(check.syscall, args) {
        Action::Allow => None,
        Action::Errno(errno) => Some(errno),
    }
}

/// The symbolic name of an errno the probe may see.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EUSERS => "EUSERS",
        libc::ENOKEY => "ENOKEY",
        _ => return format!("errno {errno}"),
    };
    name.to_owned()
}

fn run_result(result: Result<(), String>) -> Value {
    match result {
        Ok(()) => json!({"ok": true, "error": null}),
        Err(error) => json!({"ok": false, "error": error}),
    }
}

fn spawn_ok(command: &mut Command) -> Result<(), String> {
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("exited with {status}"))
    }
}

/// `/proc/self/status` fields the report includes.
pub const STATUS_FIELDS: &[&str] = &[
    "CapInh",
    "CapPrm",
    "CapEff",
    "CapBnd",
    "CapAmb",
    "NoNewPrivs",
    "Seccomp",
    "Seccomp_filters",
];

fn status() -> Value {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut map = Map::new();
    for line in text.lines() {
        if let Some((key, value)) = line.split_once(':') {
            if STATUS_FIELDS.contains(&key) {
                map.insert(key.to_owned(), json!(value.trim()));
            }
        }
    }
    Value::Object(map)
}

/// The x32 `mount` call alone (x86_64 only): its outcome, if the process
/// survives it.
pub fn single_x32_mount(arch: Arch) -> Value {
    match checks(arch).into_iter().find(|c| c.how == How::X32) {
        Some(check) => Value::Object(run_check(arch, &check).0.to_json()),
        None => json!({"skipped": "no x32 ABI on this architecture"}),
    }
}

/// The result of `unshare(CLONE_NEWUSER)` in this process (`--single
/// unshare-newuser`, run in a fresh single-threaded child).
pub fn unshare_newuser_here(arch: Arch) -> Value {
    let newuser = NAMESPACE_FLAGS
        .iter()
        .find(|(ns, _)| *ns == "newuser")
        .map_or(0x1000_0000, |&(_, flag)| flag);
    Value::Object(raw(arch.syscall_number("unshare"), [newuser, 0, 0, 0, 0, 0]).to_json())
}

fn unshare_newuser_in_child() -> Value {
    let run = || -> Result<Value, String> {
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let output = Command::new(exe)
            .args(["--single", "unshare-newuser"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        serde_json::from_slice(&output.stdout).map_err(|e| format!("{e}: {}", output.status))
    };
    run().unwrap_or_else(
        |error| json!({"ret": null, "errno": null, "error": null, "spawn_error": error}),
    )
}

/// Runs every check and returns the report.
pub fn report(arch: Arch, applied_default_seccomp: bool) -> Value {
    report_with(arch, applied_default_seccomp, false)
}

/// [`report`], without the x32 check when `skip_x32`: under a container
/// runtime's filter (libseccomp), a call of an ABI the profile does not
/// list kills the process instead of failing, and the report would be lost
/// with it (see [`single_x32_mount`]).
pub fn report_with(arch: Arch, applied_default_seccomp: bool, skip_x32: bool) -> Value {
    let policy = default_policy();
    let mut syscalls = BTreeMap::new();
    for check in checks(arch) {
        if skip_x32 && check.how == How::X32 {
            continue;
        }
        let (outcome, args) = run_check(arch, &check);
        let want = policy_errno(&policy, &check, &args);
        let refused = matches!((outcome, want), (Outcome::Errno(e), Some(w)) if e == w);
        let mut entry = outcome.to_json();
        entry.insert("syscall".into(), json!(check.syscall));
        entry.insert(
            "args".into(),
            json!(args.iter().map(|a| format!("{a:#x}")).collect::<Vec<_>>()),
        );
        entry.insert("allowed_looks_like".into(), json!(check.allowed_looks_like));
        entry.insert(
            "kernel_may_refuse".into(),
            json!(check.kernel_may_refuse.as_str()),
        );
        entry.insert(
            "policy".into(),
            json!(want.map_or_else(|| "allow".to_owned(), errno_name)),
        );
        entry.insert("refused".into(), json!(refused));
        syscalls.insert(check.name, Value::Object(entry));
    }

    let personality = arch.syscall_number("personality");
    let ioctl = arch.syscall_number("ioctl");
    let behaviour = json!({
        "unshare_newuser": unshare_newuser_in_child(),
        "personality_query": raw(personality, [PERSONALITY_QUERY, 0, 0, 0, 0, 0]).to_json(),
        "tiocsti_fd0": raw(ioctl, [0, TIOCSTI, BAD_ADDRESS, 0, 0, 0]).to_json(),
        "thread": run_result(
            std::thread::spawn(|| 42)
                .join()
                .map_err(|_| "the thread panicked".to_owned())
                .and_then(|v| if v == 42 { Ok(()) } else { Err("wrong value".into()) }),
        ),
        "spawn_self": run_result(
            std::env::current_exe()
                .map_err(|e| e.to_string())
                .and_then(|exe| spawn_ok(Command::new(exe).args(["--single", "noop"]))),
        ),
        "shell_background_job": run_result(spawn_ok(
            Command::new("/bin/sh").args(["-c", "true & wait $!"]),
        )),
    });

    use hako_sys::rustix::process;
    json!({
        "arch": arch.name(),
        "applied_default_seccomp": applied_default_seccomp,
        "status": status(),
        "uid": process::getuid().as_raw(),
        "euid": process::geteuid().as_raw(),
        "gid": process::getgid().as_raw(),
        "egid": process::getegid().as_raw(),
        // Asked of the kernel, for kernels whose /proc/self/status has no
        // NoNewPrivs line (gVisor).
        "no_new_privs": hako_sys::raw::no_new_privs().map(u8::from).ok(),
        "hostname": std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default(),
        "syscalls": syscalls,
        "behaviour": behaviour,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn native() -> Arch {
        Arch::native().unwrap()
    }

    #[test]
    fn every_syscall_of_the_policy_has_a_check_the_policy_refuses() {
        let policy = default_policy();
        let mut refused = BTreeSet::new();
        for check in checks(native()) {
            if check.how == How::X32 {
                continue;
            }
            let errno = policy_errno(&policy, &check, &check.args);
            assert!(
                errno.is_some(),
                "{} is not refused by the policy",
                check.name
            );
            refused.insert(check.syscall);
        }
        for name in policy.syscalls() {
            assert!(refused.contains(name), "no check calls {name}");
        }
    }

    #[test]
    fn every_rule_of_unshare_clone_and_ioctl_has_a_check() {
        let policy = default_policy();
        let checks = checks(native());
        for rule in policy
            .rules
            .iter()
            .filter(|r| ["unshare", "clone", "ioctl"].contains(&r.syscall.as_str()))
        {
            assert!(
                checks
                    .iter()
                    .any(|c| policy.matching_rule(c.syscall, &c.args) == Some(rule)),
                "no check for {rule:?}"
            );
        }
    }

    #[test]
    fn check_names_are_unique_and_every_check_exists_here() {
        let checks = checks(native());
        let names: BTreeSet<_> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), checks.len());
        for check in &checks {
            assert!(
                native().syscall_number(check.syscall).is_some(),
                "{}",
                check.name
            );
        }
    }

    #[test]
    fn hako_sys_accepts_every_check() {
        for check in checks(native()) {
            let (outcome, _) = run_check(native(), &check);
            assert!(
                !matches!(outcome, Outcome::NotMade(_) | Outcome::NoSuchCall),
                "{}: {outcome:?}",
                check.name
            );
        }
    }
}
