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
//! null or [`BAD_ADDRESS`](hako_sys::raw::BAD_ADDRESS), every flag set is invalid or every id
//! nonexistent, so each call fails before it acts; the one call that would
//! act (`personality` with `ADDR_NO_RANDOMIZE`) is undone at once.
//!
//! The checks are a table (`table`); `call` makes one and reads its
//! outcome; `report` puts the report together; [`steal`] holds the attacks
//! on the guest's link.

mod call;
mod report;
pub mod steal;
mod table;

pub use call::{errno_name, policy_errno, run_check, Outcome};
pub use report::{report, report_with, single_x32_mount, unshare_newuser_here, STATUS_FIELDS};
pub use table::{checks, Check, How, KernelMayRefuse};
