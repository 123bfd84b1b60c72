//! The policy as data, its validation, its reference semantics, and the
//! default policy.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Error;

/// `EPERM`: the refusal a program reports as "Operation not permitted".
pub const EPERM: i32 = 1;
/// `ENOSYS`: "Function not implemented", which makes libc fall back to an
/// older system call.
pub const ENOSYS: i32 = 38;

/// The largest `errno` a rule may return (the kernel's `MAX_ERRNO`).
pub const MAX_ERRNO: i32 = 4095;

/// What the filter does with a system call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Let the kernel run it.
    Allow,
    /// Fail it with this `errno` (1 to [`MAX_ERRNO`]) without running it.
    Errno(i32),
}

/// How an argument is compared with [`Condition::value`].
///
/// Arguments are compared as the full 64-bit register. Where the kernel reads
/// only the low 32 bits (an `int` or `unsigned int` parameter), compare with
/// `MaskedEq(0xffff_ffff)` or a mask within the low 32 bits, so that a caller
/// cannot dodge the rule by setting high bits the kernel ignores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// `arg == value`.
    Eq,
    /// `arg != value`.
    Ne,
    /// `arg & mask == value`; `value` must lie within `mask`.
    MaskedEq(u64),
}

/// One comparison of a system call argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Condition {
    /// Argument index, 0 to 5.
    pub arg: u8,
    /// The comparison.
    pub op: Op,
    /// The value compared with.
    pub value: u64,
}

impl Condition {
    /// `arg == value`.
    pub fn eq(arg: u8, value: u64) -> Self {
        Self {
            arg,
            op: Op::Eq,
            value,
        }
    }

    /// `arg != value`.
    pub fn ne(arg: u8, value: u64) -> Self {
        Self {
            arg,
            op: Op::Ne,
            value,
        }
    }

    /// `arg & mask == value`.
    pub fn masked_eq(arg: u8, mask: u64, value: u64) -> Self {
        Self {
            arg,
            op: Op::MaskedEq(mask),
            value,
        }
    }

    /// Every bit of `bits` is set in the argument.
    pub fn has_bits(arg: u8, bits: u64) -> Self {
        Self::masked_eq(arg, bits, bits)
    }

    /// Whether the condition holds for these arguments.
    pub fn matches(&self, args: &[u64; 6]) -> bool {
        let Some(&arg) = args.get(usize::from(self.arg)) else {
            return false;
        };
        match self.op {
            Op::Eq => arg == self.value,
            Op::Ne => arg != self.value,
            Op::MaskedEq(mask) => arg & mask == self.value,
        }
    }
}

/// A system call, the conditions on its arguments (all must hold; none means
/// always), and what to do when they hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// The kernel's name of the system call, e.g. `"mount"`.
    pub syscall: String,
    /// What to do when every condition holds.
    pub action: Action,
    /// Conditions on the arguments, all of which must hold. At most one per
    /// argument index: libseccomp, which runs the OCI rendering, cannot AND
    /// two comparisons of one argument. Several rules for one system call
    /// are OR-ed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Why, in one line.
    pub reason: String,
}

impl Rule {
    /// Refuses `syscall` with `errno` whatever its arguments.
    pub fn errno(syscall: &str, errno: i32, reason: &str) -> Self {
        Self {
            syscall: syscall.to_owned(),
            action: Action::Errno(errno),
            conditions: Vec::new(),
            reason: reason.to_owned(),
        }
    }

    /// Adds a condition.
    pub fn when(mut self, condition: Condition) -> Self {
        self.conditions.push(condition);
        self
    }

    /// Whether the rule applies to `syscall` with these arguments.
    pub fn matches(&self, syscall: &str, args: &[u64; 6]) -> bool {
        self.syscall == syscall && self.conditions.iter().all(|c| c.matches(args))
    }
}

/// A seccomp policy: a default action and the rules that override it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The action for every system call no rule matches.
    pub default: Action,
    /// The rules.
    pub rules: Vec<Rule>,
}

impl Policy {
    /// What the policy does with `syscall` called with `args`: the action of
    /// a matching rule, or the default. This is the reference the compiled
    /// filter is tested against; it says nothing about x32 system calls,
    /// which a compiled filter refuses with `ENOSYS` (see [`crate::compile`]).
    pub fn action_for(&self, syscall: &str, args: &[u64; 6]) -> Action {
        self.matching_rule(syscall, args)
            .map_or(self.default, |rule| rule.action)
    }

    /// The first rule that matches `syscall` with `args`.
    pub fn matching_rule(&self, syscall: &str, args: &[u64; 6]) -> Option<&Rule> {
        self.rules.iter().find(|rule| rule.matches(syscall, args))
    }

    /// The distinct system call names the rules mention, sorted.
    pub fn syscalls(&self) -> BTreeSet<&str> {
        self.rules
            .iter()
            .map(|rule| rule.syscall.as_str())
            .collect()
    }

    /// Checks what both the BPF compiler and libseccomp (for the OCI
    /// rendering) need, so that both renderings mean the same thing:
    /// - names are lowercase identifiers;
    /// - every `errno` is 1 to [`MAX_ERRNO`];
    /// - no rule has the default action (it would do nothing);
    /// - a condition's argument index is 0 to 5, at most one condition per
    ///   index in a rule, and a masked value lies within its mask;
    /// - all rules for one system call have the same action (otherwise the
    ///   outcome would depend on rule order, which libseccomp does not keep);
    /// - no rule is repeated.
    pub fn validate(&self) -> Result<(), Error> {
        check_action(self.default, "default")?;
        let mut action_of: BTreeMap<&str, Action> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for rule in &self.rules {
            let invalid = |why: String| Error::InvalidRule {
                syscall: rule.syscall.clone(),
                why,
            };
            let name_ok = !rule.syscall.is_empty()
                && rule
                    .syscall
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            if !name_ok {
                return Err(invalid("not a system call name".into()));
            }
            check_action(rule.action, &rule.syscall)?;
            if rule.action == self.default {
                return Err(invalid("the rule's action is the default action".into()));
            }
            let mut args = BTreeSet::new();
            for c in &rule.conditions {
                if c.arg > 5 {
                    return Err(invalid(format!("argument index {} is not 0 to 5", c.arg)));
                }
                if !args.insert(c.arg) {
                    return Err(invalid(format!(
                        "two conditions on argument {} (libseccomp cannot AND them)",
                        c.arg
                    )));
                }
                if let Op::MaskedEq(mask) = c.op {
                    if mask == 0 {
                        return Err(invalid("a mask of 0 matches every value".into()));
                    }
                    if c.value & !mask != 0 {
                        return Err(invalid(format!(
                            "value {:#x} has bits outside mask {mask:#x}",
                            c.value
                        )));
                    }
                }
            }
            if let Some(other) = action_of.insert(&rule.syscall, rule.action) {
                if other != rule.action {
                    return Err(invalid("rules with different actions".into()));
                }
            }
            let mut conditions = rule.conditions.clone();
            conditions.sort();
            if !seen.insert((rule.syscall.as_str(), conditions)) {
                return Err(invalid("the same rule twice".into()));
            }
        }
        Ok(())
    }
}

fn check_action(action: Action, what: &str) -> Result<(), Error> {
    match action {
        Action::Errno(errno) if !(1..=MAX_ERRNO).contains(&errno) => Err(Error::InvalidRule {
            syscall: what.to_owned(),
            why: format!("errno {errno} is not 1 to {MAX_ERRNO}"),
        }),
        _ => Ok(()),
    }
}

// Flag values, the same on x86_64 and aarch64 (include/uapi/linux/sched.h,
// personality.h, asm-generic/ioctls.h).
const CLONE_NEWTIME: u64 = 0x0000_0080;
const CLONE_NEWNS: u64 = 0x0002_0000;
const CLONE_NEWCGROUP: u64 = 0x0200_0000;
const CLONE_NEWUTS: u64 = 0x0400_0000;
const CLONE_NEWIPC: u64 = 0x0800_0000;
const CLONE_NEWUSER: u64 = 0x1000_0000;
const CLONE_NEWPID: u64 = 0x2000_0000;
const CLONE_NEWNET: u64 = 0x4000_0000;
/// `personality(2)` flag that turns address-space randomisation off.
pub const ADDR_NO_RANDOMIZE: u64 = 0x0004_0000;
/// The `personality(2)` argument that only queries the persona.
pub const PERSONALITY_QUERY: u64 = 0xffff_ffff;
/// `ioctl` request: push a byte into a terminal's input queue.
pub const TIOCSTI: u64 = 0x5412;
/// `ioctl` request: the Linux console's multiplexed request (paste the
/// selection into the input, read the screen, ...).
pub const TIOCLINUX: u64 = 0x541c;

/// The namespace flags `unshare` and `clone` are refused, with their names.
/// `CLONE_NEWTIME` is refused to `unshare` only: in `clone`'s flags the same
/// bit belongs to the exit signal (`CSIGNAL`), and `clone` cannot create a
/// time namespace anyway.
pub const NAMESPACE_FLAGS: &[(&str, u64)] = &[
    ("newuser", CLONE_NEWUSER),
    ("newns", CLONE_NEWNS),
    ("newpid", CLONE_NEWPID),
    ("newnet", CLONE_NEWNET),
    ("newipc", CLONE_NEWIPC),
    ("newuts", CLONE_NEWUTS),
    ("newcgroup", CLONE_NEWCGROUP),
    ("newtime", CLONE_NEWTIME),
];

const MOUNT: &str = "changing mounts could uncover what the sandbox's filesystem view hides or expose more of the host";
const NEW_MOUNT_API: &str =
    "the new mount API has the power of mount(2): mounts could be created, moved or changed";
const NAMESPACE: &str = "a new namespace (a user namespace grants every capability inside it) is the first step of most kernel privilege escalations";
const KEYRING: &str =
    "the kernel keyrings are not namespaced: keys of the host user could be read or planted";
const TRACE: &str = "reads and writes the memory of another process";
const IO_URING: &str = "io_uring performs its operations without passing through seccomp and is a frequent source of kernel bugs";
const KEXEC: &str = "loads a new kernel";
const MODULE: &str = "loads or unloads kernel code";
const SWAP: &str = "changes the host's swap devices";
const CLOCK: &str =
    "the clock is host-wide: setting it affects every process, logs and certificate checks";

/// The policy of the `linux` backend: allow everything except what lets a
/// process change the filesystem view, enter or create namespaces, reach
/// host-wide kernel state (keys, clock, modules, kexec, swap, accounting,
/// reboot), observe or control other processes, use large attack surfaces
/// (bpf, perf, io_uring, userfaultfd), disable ASLR, or inject terminal
/// input. Each is refused with `EPERM`, never killed, so programs fail
/// readably; `clone3` gets `ENOSYS`, on which glibc and musl fall back to
/// `clone`, whose flags the filter can check.
///
/// Namespaces: `unshare` and `clone` are refused when their flags ask for
/// any new namespace, not only a user namespace. Without capabilities the
/// kernel refuses all but a user namespace itself, so this changes nothing
/// for programs in the sandbox, and it still holds if a capability were left
/// by mistake.
///
/// `personality` is refused when it would set `ADDR_NO_RANDOMIZE`, that is
/// when that bit is set and the low 32 bits (all the kernel reads) are not
/// `0xffffffff`, the query, which stays allowed. As a rule may compare an
/// argument only once, that condition is written as 31 rules, one per other
/// low bit: "bit 18 set and bit N clear".
pub fn default_policy() -> Policy {
    let eperm = |name: &str, reason: &str| Rule::errno(name, EPERM, reason);
    let mut rules = vec![
        eperm("mount", MOUNT),
        eperm("umount2", MOUNT),
        eperm(
            "pivot_root",
            "changing the root directory could undo the sandbox's filesystem view",
        ),
    ];
    for name in [
        "move_mount",
        "open_tree",
        "fsopen",
        "fsmount",
        "fsconfig",
        "fspick",
        "mount_setattr",
        "open_tree_attr",
    ] {
        rules.push(eperm(name, NEW_MOUNT_API));
    }
    for &(_, flag) in NAMESPACE_FLAGS {
        rules.push(eperm("unshare", NAMESPACE).when(Condition::has_bits(0, flag)));
    }
    for &(_, flag) in NAMESPACE_FLAGS.iter().filter(|(_, f)| *f != CLONE_NEWTIME) {
        // The flags are argument 0 of clone on x86_64 and aarch64 alike.
        rules.push(eperm("clone", NAMESPACE).when(Condition::has_bits(0, flag)));
    }
    rules.push(Rule::errno(
        "clone3",
        ENOSYS,
        "its flags are in memory a filter cannot read, so a new namespace could not be refused; on ENOSYS libc falls back to clone, which is checked",
    ));
    rules.push(eperm(
        "setns",
        "joining another namespace would leave the sandbox's",
    ));
    for name in ["keyctl", "add_key", "request_key"] {
        rules.push(eperm(name, KEYRING));
    }
    rules.push(eperm(
        "bpf",
        "eBPF is a large kernel attack surface and can observe the whole host",
    ));
    rules.push(eperm(
        "perf_event_open",
        "performance events can observe other processes and the kernel, and are a large attack surface",
    ));
    rules.push(eperm("ptrace", TRACE));
    rules.push(eperm("process_vm_readv", TRACE));
    rules.push(eperm("process_vm_writev", TRACE));
    rules.push(eperm(
        "pidfd_getfd",
        "copies a descriptor out of another process (the guest's link to hako, where the kernel's access check is weaker than Linux's, as gVisor's)",
    ));
    rules.push(eperm(
        "userfaultfd",
        "pausing page faults at will is a standard aid to exploiting kernel races",
    ));
    for name in ["io_uring_setup", "io_uring_enter", "io_uring_register"] {
        rules.push(eperm(name, IO_URING));
    }
    rules.push(eperm("kexec_load", KEXEC));
    rules.push(eperm("kexec_file_load", KEXEC));
    for name in ["init_module", "finit_module", "delete_module"] {
        rules.push(eperm(name, MODULE));
    }
    rules.push(eperm(
        "open_by_handle_at",
        "opening files by handle bypasses path-based confinement (the 'shocker' container escape)",
    ));
    rules.push(eperm(
        "reboot",
        "reboots the host, or kills every process of the pid namespace",
    ));
    rules.push(eperm("swapon", SWAP));
    rules.push(eperm("swapoff", SWAP));
    rules.push(eperm(
        "acct",
        "process accounting is host-wide and writes a file of the caller's choice",
    ));
    for name in ["settimeofday", "clock_settime", "clock_adjtime", "adjtimex"] {
        rules.push(eperm(name, CLOCK));
    }
    for bit in (0..32)
        .map(|n| 1u64 << n)
        .filter(|&b| b != ADDR_NO_RANDOMIZE)
    {
        rules.push(
            eperm(
                "personality",
                "ADDR_NO_RANDOMIZE turns off ASLR for the programs executed next, which eases exploiting them",
            )
            .when(Condition::masked_eq(0, ADDR_NO_RANDOMIZE | bit, ADDR_NO_RANDOMIZE)),
        );
    }
    // Reading another process's limits, or setting one's own (pid 0), stays
    // allowed. A pid argument with high bits set is refused too, although
    // the kernel reads only the low 32: refusing more is safe.
    rules.push(
        eperm(
            "prlimit64",
            "setting another process's limits could starve the processes that watch and clean up after commands (no descriptors to list what to kill)",
        )
        .when(Condition::ne(0, 0))
        .when(Condition::ne(2, 0)),
    );
    rules.push(
        eperm(
            "ioctl",
            "TIOCSTI pushes input into a terminal, which could run commands in a shell outside the sandbox",
        )
        .when(Condition::masked_eq(1, 0xffff_ffff, TIOCSTI)),
    );
    rules.push(
        eperm(
            "ioctl",
            "TIOCLINUX can paste into a console's input and read its screen",
        )
        .when(Condition::masked_eq(1, 0xffff_ffff, TIOCLINUX)),
    );
    Policy {
        default: Action::Allow,
        rules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The list from the issue (item 4) and the brief, verbatim.
    const REQUIRED: &[&str] = &[
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsmount",
        "fsconfig",
        "fspick",
        "unshare",
        "clone",
        "clone3",
        "setns",
        "keyctl",
        "add_key",
        "request_key",
        "bpf",
        "perf_event_open",
        "ptrace",
        "process_vm_readv",
        "process_vm_writev",
        "pidfd_getfd",
        "userfaultfd",
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
        "kexec_load",
        "kexec_file_load",
        "init_module",
        "finit_module",
        "delete_module",
        "open_by_handle_at",
        "reboot",
        "swapon",
        "swapoff",
        "acct",
        "settimeofday",
        "clock_settime",
        "clock_adjtime",
        "adjtimex",
        "personality",
        "ioctl",
        "prlimit64",
    ];

    fn args(a0: u64, a1: u64) -> [u64; 6] {
        [a0, a1, 0, 0, 0, 0]
    }

    #[test]
    fn the_default_policy_is_valid() {
        default_policy().validate().unwrap();
    }

    #[test]
    fn every_syscall_from_the_issue_is_refused_for_some_arguments() {
        let policy = default_policy();
        let covered = policy.syscalls();
        for name in REQUIRED {
            assert!(covered.contains(name), "{name} has no rule");
        }
    }

    #[test]
    fn every_refusal_is_eperm_except_clone3() {
        for rule in default_policy().rules {
            let want = if rule.syscall == "clone3" {
                ENOSYS
            } else {
                EPERM
            };
            assert_eq!(rule.action, Action::Errno(want), "{}", rule.syscall);
            assert!(!rule.reason.is_empty() && !rule.reason.contains('\n'));
        }
    }

    #[test]
    fn rules_are_unique() {
        let policy = default_policy();
        let mut seen = BTreeSet::new();
        for rule in &policy.rules {
            assert!(
                seen.insert((rule.syscall.clone(), rule.conditions.clone())),
                "{rule:?} twice"
            );
        }
    }

    #[test]
    fn unconditional_refusals_ignore_arguments() {
        let policy = default_policy();
        for name in ["mount", "setns", "bpf", "ptrace", "reboot", "adjtimex"] {
            assert_eq!(
                policy.action_for(name, &[7; 6]),
                Action::Errno(EPERM),
                "{name}"
            );
        }
        assert_eq!(policy.action_for("clone3", &[0; 6]), Action::Errno(ENOSYS));
        assert_eq!(policy.action_for("read", &[0; 6]), Action::Allow);
    }

    #[test]
    fn a_new_user_namespace_is_refused_but_plain_unshare_and_clone_are_not() {
        let policy = default_policy();
        let sigchld = 17;
        let thread_flags = 0x003d_0f00; // what glibc passes for pthread_create
        assert_eq!(
            policy.action_for("unshare", &args(CLONE_NEWUSER, 0)),
            Action::Errno(EPERM)
        );
        assert_eq!(
            policy.action_for("unshare", &args(CLONE_NEWTIME, 0)),
            Action::Errno(EPERM)
        );
        assert_eq!(
            policy.action_for("clone", &args(CLONE_NEWUSER | sigchld, 0)),
            Action::Errno(EPERM)
        );
        assert_eq!(
            policy.action_for("clone", &args(CLONE_NEWNET | CLONE_NEWPID | sigchld, 0)),
            Action::Errno(EPERM)
        );
        assert_eq!(policy.action_for("unshare", &args(0x400, 0)), Action::Allow);
        assert_eq!(policy.action_for("clone", &args(sigchld, 0)), Action::Allow);
        assert_eq!(
            policy.action_for("clone", &args(thread_flags, 0)),
            Action::Allow
        );
        // Bit 7 (CLONE_NEWTIME's value) belongs to the exit signal in
        // clone's flags: it is not checked there.
        assert_eq!(
            policy.action_for("clone", &args(0x80 | sigchld, 0)),
            Action::Allow
        );
    }

    #[test]
    fn personality_refuses_only_setting_addr_no_randomize() {
        let policy = default_policy();
        let refused = Action::Errno(EPERM);
        assert_eq!(
            policy.action_for("personality", &args(ADDR_NO_RANDOMIZE, 0)),
            refused
        );
        assert_eq!(
            policy.action_for("personality", &args(ADDR_NO_RANDOMIZE | 0x0008, 0)),
            refused
        );
        assert_eq!(
            policy.action_for("personality", &args(0xffff_fffe, 0)),
            refused
        );
        // High bits are ignored by the kernel, and by the rules.
        assert_eq!(
            policy.action_for("personality", &args(0xdead_0000_0004_0000, 0)),
            refused
        );
        for allowed in [
            PERSONALITY_QUERY,
            0,
            0x0008,
            0x0020_0000,
            // The kernel reads the low 32 bits: this is the query too.
            0xffff_ffff_ffff_ffff,
            0x1_ffff_ffff,
        ] {
            assert_eq!(
                policy.action_for("personality", &args(allowed, 0)),
                Action::Allow,
                "{allowed:#x}"
            );
        }
    }

    #[test]
    fn tiocsti_is_refused_even_with_high_bits_set_in_the_request() {
        let policy = default_policy();
        for cmd in [TIOCSTI, TIOCSTI | 0xffff_ffff_0000_0000, TIOCLINUX] {
            assert_eq!(
                policy.action_for("ioctl", &args(0, cmd)),
                Action::Errno(EPERM),
                "{cmd:#x}"
            );
        }
        assert_eq!(policy.action_for("ioctl", &args(0, 0x5401)), Action::Allow);
    }

    #[test]
    fn validation_rejects_what_libseccomp_or_bpf_cannot_mean() {
        let ok = || Policy {
            default: Action::Allow,
            rules: vec![Rule::errno("mount", EPERM, "r")],
        };
        ok().validate().unwrap();
        let mut p = ok();
        p.rules[0].action = Action::Allow;
        assert!(p.validate().is_err(), "a rule with the default action");
        let mut p = ok();
        p.rules[0].action = Action::Errno(0);
        assert!(p.validate().is_err(), "errno 0");
        let mut p = ok();
        p.rules[0].syscall = "Mount; rm".into();
        assert!(p.validate().is_err(), "a bad name");
        let mut p = ok();
        p.rules[0].conditions = vec![Condition::eq(0, 1), Condition::ne(0, 2)];
        assert!(p.validate().is_err(), "two conditions on one argument");
        let mut p = ok();
        p.rules[0].conditions = vec![Condition::eq(6, 1)];
        assert!(p.validate().is_err(), "argument 6");
        let mut p = ok();
        p.rules[0].conditions = vec![Condition::masked_eq(0, 0xf0, 0x0f)];
        assert!(p.validate().is_err(), "value outside mask");
        let mut p = ok();
        p.rules.push(Rule::errno("mount", ENOSYS, "r"));
        assert!(p.validate().is_err(), "two actions for one syscall");
        let mut p = ok();
        p.rules.push(Rule::errno("mount", EPERM, "again"));
        assert!(p.validate().is_err(), "a repeated rule");
    }

    #[test]
    fn a_policy_round_trips_through_json() {
        let policy = default_policy();
        let text = serde_json::to_string(&policy).unwrap();
        let back: Policy = serde_json::from_str(&text).unwrap();
        assert_eq!(back, policy);
        let rule: Rule = serde_json::from_value(serde_json::json!({
            "syscall": "ioctl",
            "action": {"errno": 1},
            "conditions": [{"arg": 1, "op": {"masked_eq": 4294967295u64}, "value": 21522}],
            "reason": "r"
        }))
        .unwrap();
        assert_eq!(
            rule.conditions[0],
            Condition::masked_eq(1, 0xffff_ffff, TIOCSTI)
        );
    }
}
