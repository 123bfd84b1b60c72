//! hako's seccomp policy as data, compiled to BPF for the native backend and
//! rendered to the OCI / Docker profile JSON for containers.
//!
//! A [`Policy`] is a default [`Action`] and [`Rule`]s: a system call name,
//! conditions on its arguments, the action, and a one-line reason. It is
//! plain serde data, so the same policy can be shown, stored and checked.
//! [`default_policy`] is the policy of the `linux` backend;
//! [`shared_namespace_policy`] what the `landlock` backend adds on top.
//!
//! - [`compile`] turns a policy into a [`Program`] of classic-BPF
//!   instructions for the running architecture (x86_64 or aarch64): a
//!   binary search over the system call numbers the rules name;
//!   [`apply`] installs it on the calling thread (the caller sets
//!   `no_new_privs` first).
//! - [`to_oci`] renders the same policy as the `linux.seccomp` object of an
//!   OCI runtime spec (also Docker's and podman's profile format).
//! - [`Policy::action_for`] is the reference meaning of a policy, which the
//!   compiled program is tested against with a BPF interpreter.
//!
//! Cost: the default policy compiles to about 300 instructions, 124 of
//! them for the 31 `personality` rules. A call is decided by a binary search
//! over the numbers the rules name (about a dozen comparisons); since Linux
//! 5.11 the kernel emulates a filter once per system call number when it is
//! installed and, where the answer cannot depend on the arguments (every call
//! except the few with conditional rules), caches "allow" and skips the
//! filter for it.

mod compile;
mod oci;
mod policy;
mod shared;
mod table;

#[cfg(test)]
mod interp;

pub use compile::{apply, compile, compile_for, Arch, Program, X32_SYSCALL_BIT};
pub use libc::sock_filter;
pub use oci::{to_oci, to_oci_for};
pub use policy::{
    default_policy, Action, Condition, Op, Policy, Rule, ADDR_NO_RANDOMIZE, ENOSYS, EPERM,
    MAX_ERRNO, NAMESPACE_FLAGS, PERSONALITY_QUERY, TIOCLINUX, TIOCSTI,
};
pub use shared::{shared_namespace_policy, SharedPolicy, AF_INET, AF_INET6, AF_UNIX};

/// What went wrong validating, compiling or installing a policy.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A rule the policy cannot mean the same thing by in BPF and libseccomp.
    #[error("invalid seccomp rule for {syscall}: {why}")]
    InvalidRule {
        /// The system call named by the rule (or `default`).
        syscall: String,
        /// What is wrong.
        why: String,
    },
    /// A system call name unknown on every supported architecture.
    #[error("unknown system call {name:?} on {arch} (and on every other supported architecture)")]
    UnknownSyscall {
        /// The name.
        name: String,
        /// The architecture compiled for.
        arch: &'static str,
    },
    /// The program exceeds the kernel's 4096 instructions.
    #[error("the seccomp filter has {0} instructions; the kernel takes at most 4096")]
    TooLarge(usize),
    /// The running architecture has no system call table here.
    #[error("seccomp filters are not supported on {0}; hint: x86_64 and aarch64 are")]
    UnsupportedArch(&'static str),
    /// The program was compiled for another architecture.
    #[error("the seccomp program is for {program}, this is {native}")]
    WrongArch {
        /// The program's architecture.
        program: &'static str,
        /// The running architecture.
        native: &'static str,
    },
    /// The kernel refused to install the filter.
    #[error("cannot install the seccomp filter: {source}; hint: set no_new_privs first (EACCES), and the kernel needs CONFIG_SECCOMP_FILTER (EINVAL)")]
    Apply {
        /// The OS error.
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::interp::run;

    const KILL: u32 = 0x8000_0000;
    const ALLOW: u32 = 0x7fff_0000;
    const REFUSED_EPERM: u32 = 0x0005_0000 | 1;
    const REFUSED_ENOSYS: u32 = 0x0005_0000 | 38;

    fn nr(arch: Arch, name: &str) -> u32 {
        arch.syscall_number(name).unwrap() as u32
    }

    #[test]
    fn the_default_policy_compiles_for_every_architecture() {
        for arch in Arch::ALL {
            let program = compile_for(&default_policy(), arch).unwrap();
            assert!(
                program.skipped().is_empty(),
                "{arch:?}: {:?}",
                program.skipped()
            );
            assert!(program.instructions().len() < 4096);
        }
        compile(&default_policy()).unwrap();
    }

    #[test]
    fn the_tables_agree_with_libc_for_the_native_architecture() {
        let native = Arch::native().unwrap();
        let pairs = [
            ("read", libc::SYS_read),
            ("mount", libc::SYS_mount),
            ("umount2", libc::SYS_umount2),
            ("clone", libc::SYS_clone),
            ("clone3", libc::SYS_clone3),
            ("ioctl", libc::SYS_ioctl),
            ("personality", libc::SYS_personality),
            ("mount_setattr", libc::SYS_mount_setattr),
            ("kexec_file_load", libc::SYS_kexec_file_load),
            ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ];
        for (name, number) in pairs {
            assert_eq!(native.syscall_number(name), Some(number), "{name}");
        }
        assert_eq!(native.syscall_number("open_tree_attr"), Some(467));
        assert_eq!(native.syscall_number("no_such_call"), None);
    }

    #[test]
    fn a_name_unknown_everywhere_is_an_error_and_one_missing_here_is_skipped() {
        let policy = |name: &str| Policy {
            default: Action::Allow,
            rules: vec![Rule::errno(name, EPERM, "r")],
        };
        assert!(matches!(
            compile_for(&policy("mount2"), Arch::X86_64),
            Err(Error::UnknownSyscall { .. })
        ));
        // `open` exists on x86_64 but not on aarch64.
        let program = compile_for(&policy("open"), Arch::Aarch64).unwrap();
        assert_eq!(program.skipped(), ["open".to_owned()]);
        let program = compile_for(&policy("open"), Arch::X86_64).unwrap();
        assert!(program.skipped().is_empty());
    }

    /// The compiled program gives, for many calls, what
    /// `Policy::action_for` says, on both architectures.
    #[test]
    fn the_program_means_what_the_policy_says() {
        let policy = default_policy();
        let mut probes: Vec<(String, [u64; 6])> = Vec::new();
        let interesting = [
            0,
            1,
            17,
            0x5412,
            0x541c,
            0x5401,
            0x0004_0000,
            0x0004_0008,
            0xffff_ffff,
            0xffff_fffe,
            0x1_0000_5412,
            0xdead_0000_0004_0000,
            u64::MAX,
            0x1000_0000,
            0x1000_0011,
            0x003d_0f00,
            0x0002_0000,
            0x80,
        ];
        for name in policy
            .syscalls()
            .into_iter()
            .chain(["read", "write", "openat"])
        {
            for &a in &interesting {
                probes.push((name.to_owned(), [a, 0, 0, 0, 0, 0]));
                probes.push((name.to_owned(), [3, a, 0, 0, 0, 0]));
            }
        }
        for arch in Arch::ALL {
            let program = compile_for(&policy, arch).unwrap();
            for (name, args) in &probes {
                let want = compile::ret_value(policy.action_for(name, args));
                let got = run(
                    program.instructions(),
                    nr(arch, name),
                    arch.audit_arch(),
                    *args,
                );
                assert_eq!(got, want, "{arch:?} {name}{args:x?}");
            }
        }
    }

    /// Random policies (unconditional and conditional rules, every
    /// comparison, 64-bit values with high bits) compile to programs that
    /// decide every probe as the policy says, on both architectures.
    #[test]
    fn random_policies_compile_to_what_they_mean() {
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let names: Vec<&str> = crate::table::X86_64
            .iter()
            .map(|&(n, _)| n)
            .filter(|n| Arch::Aarch64.syscall_number(n).is_some())
            .collect();
        for round in 0..300 {
            let default = if round % 2 == 0 {
                Action::Allow
            } else {
                Action::Errno(EPERM)
            };
            let mut rules = Vec::new();
            let count = 1 + next() as usize % 40;
            let mut used = std::collections::BTreeSet::new();
            for _ in 0..count {
                let name = names[next() as usize % names.len()];
                if !used.insert(name) {
                    continue;
                }
                let action = match default {
                    Action::Allow if next() % 2 == 0 => Action::Errno(ENOSYS),
                    Action::Allow => Action::Errno(EPERM),
                    Action::Errno(_) => Action::Allow,
                };
                for _ in 0..(1 + next() % 3) {
                    let mut conditions = Vec::new();
                    let mut args: Vec<u8> = (0..6).collect();
                    for _ in 0..(next() % 4) {
                        let arg = args.remove(next() as usize % args.len());
                        let value = match next() % 3 {
                            0 => next() % 8,
                            1 => next() & 0xffff_ffff,
                            _ => next(),
                        };
                        let op = match next() % 3 {
                            0 => Op::Eq,
                            1 => Op::Ne,
                            _ => Op::MaskedEq(value | (next() & next())),
                        };
                        let value = match op {
                            Op::MaskedEq(mask) => value & mask,
                            _ => value,
                        };
                        if matches!(op, Op::MaskedEq(0)) {
                            continue;
                        }
                        conditions.push(Condition { arg, op, value });
                    }
                    let rule = Rule {
                        syscall: name.into(),
                        action,
                        conditions,
                        reason: "random".into(),
                    };
                    if !rules.contains(&rule) {
                        rules.push(rule);
                    }
                }
            }
            let policy = Policy { default, rules };
            policy.validate().unwrap();
            for arch in Arch::ALL {
                let program = compile_for(&policy, arch).unwrap();
                for rule in &policy.rules {
                    let mut probes = vec![[0u64; 6], [u64::MAX; 6]];
                    let mut exact = [0u64; 6];
                    for c in &rule.conditions {
                        exact[usize::from(c.arg)] = c.value;
                    }
                    probes.push(exact);
                    for c in &rule.conditions {
                        for flip in [1u64, 1 << 31, 1 << 32, 1 << 63] {
                            let mut p = exact;
                            p[usize::from(c.arg)] ^= flip;
                            probes.push(p);
                        }
                    }
                    for args in probes {
                        let want = compile::ret_value(policy.action_for(&rule.syscall, &args));
                        let got = run(
                            program.instructions(),
                            nr(arch, &rule.syscall),
                            arch.audit_arch(),
                            args,
                        );
                        assert_eq!(
                            got, want,
                            "round {round} {arch:?} {}{args:x?}",
                            rule.syscall
                        );
                    }
                }
                // Numbers no rule names get the default.
                for number in 0..600u32 {
                    let named = policy
                        .rules
                        .iter()
                        .any(|r| arch.syscall_number(&r.syscall) == Some(i64::from(number)));
                    if !named {
                        let got = run(program.instructions(), number, arch.audit_arch(), [0; 6]);
                        assert_eq!(got, compile::ret_value(default), "{arch:?} nr {number}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_default_program_is_small_and_shallow() {
        for arch in Arch::ALL {
            let program = compile_for(&default_policy(), arch).unwrap();
            assert!(
                program.instructions().len() < 400,
                "{}",
                program.instructions().len()
            );
        }
    }

    #[test]
    fn x32_calls_are_refused_with_enosys_on_x86_64() {
        let program = compile_for(&default_policy(), Arch::X86_64).unwrap();
        let x86_64 = Arch::X86_64.audit_arch();
        let mount = nr(Arch::X86_64, "mount");
        let getpid = nr(Arch::X86_64, "getpid");
        assert_eq!(
            run(
                program.instructions(),
                X32_SYSCALL_BIT | mount,
                x86_64,
                [0; 6]
            ),
            REFUSED_ENOSYS
        );
        assert_eq!(
            run(
                program.instructions(),
                X32_SYSCALL_BIT | getpid,
                x86_64,
                [0; 6]
            ),
            REFUSED_ENOSYS
        );
        // x32-only numbers (512 and up, with the bit) too.
        assert_eq!(
            run(
                program.instructions(),
                X32_SYSCALL_BIT | 512,
                x86_64,
                [0; 6]
            ),
            REFUSED_ENOSYS
        );
        assert_eq!(
            run(program.instructions(), mount, x86_64, [0; 6]),
            REFUSED_EPERM
        );
        assert_eq!(run(program.instructions(), getpid, x86_64, [0; 6]), ALLOW);
    }

    #[test]
    fn another_architecture_is_killed() {
        const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
        const AUDIT_ARCH_ARM: u32 = 40 | 0x4000_0000;
        let x86 = compile_for(&default_policy(), Arch::X86_64).unwrap();
        assert_eq!(run(x86.instructions(), 20, AUDIT_ARCH_I386, [0; 6]), KILL);
        let arm = compile_for(&default_policy(), Arch::Aarch64).unwrap();
        assert_eq!(run(arm.instructions(), 20, AUDIT_ARCH_ARM, [0; 6]), KILL);
        assert_eq!(
            run(arm.instructions(), 20, Arch::X86_64.audit_arch(), [0; 6]),
            KILL
        );
    }

    #[test]
    fn an_allowlist_policy_compiles_too() {
        let policy = Policy {
            default: Action::Errno(EPERM),
            rules: vec![
                Rule {
                    syscall: "read".into(),
                    action: Action::Allow,
                    conditions: vec![],
                    reason: "r".into(),
                },
                Rule {
                    syscall: "write".into(),
                    action: Action::Allow,
                    conditions: vec![Condition::eq(0, 1)],
                    reason: "stdout only".into(),
                },
            ],
        };
        let arch = Arch::native().unwrap();
        let program = compile_for(&policy, arch).unwrap();
        let run = |name, args| {
            run(
                program.instructions(),
                nr(arch, name),
                arch.audit_arch(),
                args,
            )
        };
        assert_eq!(run("read", [5; 6]), ALLOW);
        assert_eq!(run("write", [1, 0, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run("write", [2, 0, 0, 0, 0, 0]), REFUSED_EPERM);
        assert_eq!(run("getpid", [0; 6]), REFUSED_EPERM);
    }

    /// Installs the default filter on a fresh thread of the test process
    /// (filters apply per thread) and checks a few calls for real.
    #[test]
    fn the_installed_filter_refuses_on_this_kernel() {
        use hako_sys::raw::{syscall_ints, SyscallError, BAD_ADDRESS};
        let program = compile(&default_policy()).unwrap();
        let outcome = std::thread::spawn(move || {
            hako_sys::raw::set_no_new_privs().unwrap();
            apply(&program).unwrap();
            let mount = syscall_ints(libc::SYS_mount, [0; 6]);
            let clone3 = syscall_ints(libc::SYS_clone3, [BAD_ADDRESS, 88, 0, 0, 0, 0]);
            let tiocsti_high = syscall_ints(
                libc::SYS_ioctl,
                [u64::MAX, 0xdead_0000_0000_5412, BAD_ADDRESS, 0, 0, 0],
            );
            let getpid = syscall_ints(libc::SYS_getpid, [0; 6]);
            // A thread created under the filter: glibc tries clone3, gets
            // ENOSYS, and falls back to clone.
            let nested = std::thread::spawn(|| 7).join().ok();
            (mount, clone3, tiocsti_high, getpid.is_ok(), nested)
        })
        .join()
        .unwrap();
        assert_eq!(outcome.0, Err(SyscallError::Errno(libc::EPERM)));
        assert_eq!(outcome.1, Err(SyscallError::Errno(libc::ENOSYS)));
        assert_eq!(outcome.2, Err(SyscallError::Errno(libc::EPERM)));
        assert!(outcome.3);
        assert_eq!(outcome.4, Some(7));
        // This thread is not filtered.
        assert_eq!(
            syscall_ints(libc::SYS_clone3, [BAD_ADDRESS, 88, 0, 0, 0, 0]),
            Err(SyscallError::Errno(libc::EFAULT))
        );
    }

    #[test]
    fn a_program_for_another_architecture_is_not_installed() {
        let other = if Arch::native() == Some(Arch::X86_64) {
            Arch::Aarch64
        } else {
            Arch::X86_64
        };
        let program = compile_for(&default_policy(), other).unwrap();
        assert!(matches!(apply(&program), Err(Error::WrongArch { .. })));
    }
}
