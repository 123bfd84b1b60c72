//! Compiling a policy to one classic-BPF program, and installing it.

use std::collections::BTreeMap;
use std::sync::Arc;

use seccompiler::{
    sock_filter, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::policy::{Action, Op, Policy, ENOSYS};
use crate::{table, Error};

/// An architecture the compiler knows the system call numbers of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// x86_64 (the 64-bit ABI; x32 calls are refused, see [`compile`]).
    X86_64,
    /// aarch64 (little-endian, 64-bit).
    Aarch64,
}

impl Arch {
    /// Every supported architecture.
    pub const ALL: [Arch; 2] = [Arch::X86_64, Arch::Aarch64];

    /// The architecture this crate was built for, if supported.
    pub fn native() -> Option<Arch> {
        if cfg!(target_arch = "x86_64") {
            Some(Arch::X86_64)
        } else if cfg!(target_arch = "aarch64") {
            Some(Arch::Aarch64)
        } else {
            None
        }
    }

    /// The Rust name: `"x86_64"` or `"aarch64"`.
    pub fn name(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64",
            Arch::Aarch64 => "aarch64",
        }
    }

    /// The libseccomp / OCI name: `"SCMP_ARCH_X86_64"` or `"SCMP_ARCH_AARCH64"`.
    pub fn oci_name(self) -> &'static str {
        match self {
            Arch::X86_64 => "SCMP_ARCH_X86_64",
            Arch::Aarch64 => "SCMP_ARCH_AARCH64",
        }
    }

    /// The `AUDIT_ARCH_*` value the kernel passes to the filter.
    pub fn audit_arch(self) -> u32 {
        const ARCH_64BIT_LE: u32 = 0x8000_0000 | 0x4000_0000;
        match self {
            Arch::X86_64 => 62 | ARCH_64BIT_LE,
            Arch::Aarch64 => 183 | ARCH_64BIT_LE,
        }
    }

    /// The number of system call `name` on this architecture.
    pub fn syscall_number(self, name: &str) -> Option<i64> {
        let table = self.table();
        table
            .binary_search_by(|(n, _)| (*n).cmp(name))
            .ok()
            .and_then(|i| table.get(i))
            .map(|&(_, nr)| nr)
    }

    fn table(self) -> &'static [(&'static str, i64)] {
        match self {
            Arch::X86_64 => table::X86_64,
            Arch::Aarch64 => table::AARCH64,
        }
    }

    fn target(self) -> TargetArch {
        match self {
            Arch::X86_64 => TargetArch::x86_64,
            Arch::Aarch64 => TargetArch::aarch64,
        }
    }
}

/// A compiled filter: classic-BPF instructions for one architecture. Cheap to
/// clone (the instructions are shared).
#[derive(Clone)]
pub struct Program {
    arch: Arch,
    instructions: Arc<[sock_filter]>,
    /// The same instructions in the kernel's layout, prepared at compile
    /// time so that [`apply`] allocates nothing.
    kernel: Arc<[libc::sock_filter]>,
    skipped: Arc<[String]>,
}

impl std::fmt::Debug for Program {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Program")
            .field("arch", &self.arch)
            .field("instructions", &self.instructions.len())
            .field("skipped", &self.skipped)
            .finish()
    }
}

impl Program {
    /// The architecture the program checks for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The BPF instructions, as the kernel takes them.
    pub fn instructions(&self) -> &[sock_filter] {
        &self.instructions
    }

    /// Names the policy mentions that do not exist on this architecture
    /// (but do on another supported one), and so have no rule here.
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }
}

/// The x86_64 bit that marks a system call number as the x32 ABI's.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// The kernel's limit on one filter (`BPF_MAXINSNS`).
const MAX_INSTRUCTIONS: usize = 4096;

// Classic-BPF opcodes (linux/bpf_common.h) and seccomp return values.
/// `BPF_LD | BPF_W | BPF_ABS` (the first two are 0).
const LD_W_ABS: u16 = 0x20;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x05 | 0x10;
const JMP_JGE_K: u16 = 0x05 | 0x30;
const RET_K: u16 = 0x06;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The seccomp return value of an action.
pub(crate) fn ret_value(action: Action) -> u32 {
    match action {
        Action::Allow => RET_ALLOW,
        // Validated to be 1..=4095.
        Action::Errno(errno) => RET_ERRNO | (errno as u32 & 0xffff),
    }
}

fn seccompiler_action(action: Action) -> SeccompAction {
    match action {
        Action::Allow => SeccompAction::Allow,
        Action::Errno(errno) => SeccompAction::Errno(errno as u32),
    }
}

/// Compiles `policy` for the architecture this crate was built for.
///
/// See [`compile_for`].
pub fn compile(policy: &Policy) -> Result<Program, Error> {
    let arch = Arch::native().ok_or(Error::UnsupportedArch(std::env::consts::ARCH))?;
    compile_for(policy, arch)
}

/// Compiles `policy` to one BPF program for `arch`.
///
/// The program:
/// 1. on x86_64, kills the process if the call is not of the x86_64 ABI
///    (an i386 `int 0x80`), and refuses every x32 call (number with
///    [`X32_SYSCALL_BIT`] set) with `ENOSYS`: x32 numbers differ from the
///    ones the rules check, so allowing them would bypass every rule;
/// 2. for each action of the rules (for [`crate::default_policy`], `EPERM`
///    then `ENOSYS`), runs a
///    filter built by `seccompiler` (which itself first kills a process of
///    another architecture, e.g. AArch32 on aarch64): a call matching a rule
///    gets that action, any other continues to the next filter;
/// 3. gives the default action.
///
/// Arguments are compared as 64-bit values. A name that does not exist on
/// `arch` but does on another supported architecture is skipped (and listed
/// in [`Program::skipped`]); any other unknown name is an error, as is a
/// policy that fails [`Policy::validate`].
pub fn compile_for(policy: &Policy, arch: Arch) -> Result<Program, Error> {
    policy.validate()?;
    // action -> syscall number -> rules (None: unconditional).
    let mut groups: BTreeMap<Action, BTreeMap<i64, Option<Vec<SeccompRule>>>> = BTreeMap::new();
    let mut skipped: Vec<String> = Vec::new();
    for rule in &policy.rules {
        let Some(nr) = arch.syscall_number(&rule.syscall) else {
            if Arch::ALL
                .iter()
                .any(|a| a.syscall_number(&rule.syscall).is_some())
            {
                if !skipped.contains(&rule.syscall) {
                    skipped.push(rule.syscall.clone());
                }
                continue;
            }
            return Err(Error::UnknownSyscall {
                name: rule.syscall.clone(),
                arch: arch.name(),
            });
        };
        let entry = groups
            .entry(rule.action)
            .or_default()
            .entry(nr)
            .or_insert_with(|| Some(Vec::new()));
        if rule.conditions.is_empty() {
            *entry = None;
            continue;
        }
        let Some(rules) = entry else {
            continue; // already refused whatever the arguments
        };
        let conditions = rule
            .conditions
            .iter()
            .map(|c| {
                let op = match c.op {
                    Op::Eq => SeccompCmpOp::Eq,
                    Op::Ne => SeccompCmpOp::Ne,
                    Op::MaskedEq(mask) => SeccompCmpOp::MaskedEq(mask),
                };
                SeccompCondition::new(c.arg, SeccompCmpArgLen::Qword, op, c.value)
            })
            .collect::<Result<Vec<_>, _>>()?;
        rules.push(SeccompRule::new(conditions)?);
    }

    let default = ret_value(policy.default);
    let mut program: Vec<sock_filter> = Vec::new();
    if arch == Arch::X86_64 {
        program.extend([
            stmt(LD_W_ABS, DATA_ARCH),
            jump(JMP_JEQ_K, arch.audit_arch(), 1, 0),
            stmt(RET_K, RET_KILL_PROCESS),
            stmt(LD_W_ABS, DATA_NR),
            jump(JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
            stmt(RET_K, ret_value(Action::Errno(ENOSYS))),
        ]);
    }
    for (action, rules) in groups {
        let rules = rules
            .into_iter()
            .map(|(nr, rules)| (nr, rules.unwrap_or_default()))
            .collect();
        let filter = SeccompFilter::new(
            rules,
            seccompiler_action(policy.default),
            seccompiler_action(action),
            arch.target(),
        )?;
        let mut part: Vec<sock_filter> = filter.try_into()?;
        // Every return of the default action means "no rule of this action
        // matched": continue with the next part instead. A jump's offset
        // counts from the next instruction, so `len - 1 - i` lands just past
        // the part. Validation guarantees `action` is not the default, so no
        // matching return is rewritten.
        let len = part.len();
        for (i, insn) in part.iter_mut().enumerate() {
            if insn.code == RET_K && insn.k == default {
                *insn = stmt(JMP_JA, (len - 1 - i) as u32);
            }
        }
        program.extend(part);
    }
    program.push(stmt(RET_K, default));
    if program.len() > MAX_INSTRUCTIONS {
        return Err(Error::TooLarge(program.len()));
    }
    let kernel: Vec<libc::sock_filter> = program
        .iter()
        .map(|i| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect();
    Ok(Program {
        arch,
        instructions: program.into(),
        kernel: kernel.into(),
        skipped: skipped.into(),
    })
}

/// Installs `program` on the calling thread; it then applies to every
/// process and thread the thread creates, and across `execve`. Filters
/// stack and are never removed.
///
/// The caller must first set `no_new_privs` (`hako_sys::raw::set_no_new_privs`)
/// or hold `CAP_SYS_ADMIN`; otherwise the kernel refuses with `EACCES`. This
/// function does not set it, so that the caller decides the order of its
/// privilege phases. Other threads of the process are not filtered: install
/// it while single-threaded, before `execve` of the command.
///
/// It allocates nothing and makes one system call, so it may run between
/// `fork` and `exec` (compile beforehand).
pub fn apply(program: &Program) -> Result<(), Error> {
    let native = Arch::native().ok_or(Error::UnsupportedArch(std::env::consts::ARCH))?;
    if program.arch != native {
        return Err(Error::WrongArch {
            program: program.arch.name(),
            native: native.name(),
        });
    }
    hako_sys::raw::seccomp_set_mode_filter(&program.kernel)
        .map_err(|source| Error::Apply { source })
}
