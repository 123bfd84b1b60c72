//! Compiling a policy to one classic-BPF program, and installing it.

use std::collections::BTreeMap;
use std::sync::Arc;

use libc::sock_filter;

use crate::policy::{Action, Condition, Op, Policy, ENOSYS};
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
}

/// A compiled filter: classic-BPF instructions for one architecture. Cheap to
/// clone (the instructions are shared).
#[derive(Clone)]
pub struct Program {
    arch: Arch,
    instructions: Arc<[sock_filter]>,
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
/// `BPF_ALU | BPF_AND | BPF_K`.
const ALU_AND_K: u16 = 0x04 | 0x50;
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

/// Compiles `policy` for the architecture this crate was built for.
///
/// See [`compile_for`].
pub fn compile(policy: &Policy) -> Result<Program, Error> {
    let arch = Arch::native().ok_or(Error::UnsupportedArch(std::env::consts::ARCH))?;
    compile_for(policy, arch)
}

/// What the rules say about one system call number.
struct Entry {
    nr: u32,
    action: Action,
    /// `None`: whatever the arguments. Otherwise any of these condition
    /// lists (each an AND) must hold.
    when: Option<Vec<Vec<Condition>>>,
}

/// Linear runs at the leaves of the dispatch tree are at most this long.
const LEAF: usize = 4;

/// Compiles `policy` to one BPF program for `arch`.
///
/// The program:
/// 1. kills the process if the call is not of `arch`'s ABI (an i386
///    `int 0x80` on x86_64, AArch32 on aarch64), and on x86_64 refuses every
///    x32 call (number with [`X32_SYSCALL_BIT`] set) with `ENOSYS`: x32
///    numbers differ from the ones the rules check, so allowing them would
///    bypass every rule;
/// 2. finds the system call number in a binary search tree over the numbers
///    the rules name (short linear runs at the leaves), so any call is
///    decided in about a dozen comparisons;
/// 3. for a number with conditional rules, checks each rule's conditions
///    (64-bit comparisons, as two 32-bit halves) and returns the rule's
///    action when they all hold;
/// 4. otherwise returns the default action.
///
/// Every jump is forward and local (a subtree, a rule), so the layout needs
/// no trampolines. A name that does not exist on `arch` but does on another
/// supported architecture is skipped (and listed in [`Program::skipped`]);
/// any other unknown name is an error, as is a policy that fails
/// [`Policy::validate`].
pub fn compile_for(policy: &Policy, arch: Arch) -> Result<Program, Error> {
    policy.validate()?;
    let mut by_nr: BTreeMap<u32, Entry> = BTreeMap::new();
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
        let nr = u32::try_from(nr).map_err(|_| Error::UnknownSyscall {
            name: rule.syscall.clone(),
            arch: arch.name(),
        })?;
        // Validation guarantees one action per system call.
        let entry = by_nr.entry(nr).or_insert_with(|| Entry {
            nr,
            action: rule.action,
            when: Some(Vec::new()),
        });
        match (&mut entry.when, rule.conditions.is_empty()) {
            (when, true) => *when = None,
            (Some(lists), false) => lists.push(rule.conditions.clone()),
            // Already refused whatever the arguments.
            (None, false) => {}
        }
    }
    let entries: Vec<Entry> = by_nr.into_values().collect();

    let default = ret_value(policy.default);
    let mut program: Vec<sock_filter> = vec![
        stmt(LD_W_ABS, DATA_ARCH),
        jump(JMP_JEQ_K, arch.audit_arch(), 1, 0),
        stmt(RET_K, RET_KILL_PROCESS),
        stmt(LD_W_ABS, DATA_NR),
    ];
    if arch == Arch::X86_64 {
        program.extend([
            jump(JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
            stmt(RET_K, ret_value(Action::Errno(ENOSYS))),
        ]);
    }
    program.extend(dispatch(&entries, default)?);
    if program.len() > MAX_INSTRUCTIONS {
        return Err(Error::TooLarge(program.len()));
    }
    Ok(Program {
        arch,
        instructions: program.into(),
        skipped: skipped.into(),
    })
}

/// The search tree over `entries` (sorted by number), with the number in
/// the accumulator. Every path ends in a return.
fn dispatch(entries: &[Entry], default: u32) -> Result<Vec<sock_filter>, Error> {
    if entries.len() <= LEAF {
        let mut out = Vec::new();
        for entry in entries {
            match &entry.when {
                None => out.extend([
                    jump(JMP_JEQ_K, entry.nr, 0, 1),
                    stmt(RET_K, ret_value(entry.action)),
                ]),
                Some(lists) => {
                    let body = conditional(lists, ret_value(entry.action), default)?;
                    out.extend([
                        jump(JMP_JEQ_K, entry.nr, 1, 0),
                        stmt(JMP_JA, len_u32(body.len())?),
                    ]);
                    out.extend(body);
                }
            }
        }
        out.push(stmt(RET_K, default));
        return Ok(out);
    }
    let mid = entries.len() / 2;
    let left = dispatch(&entries[..mid], default)?;
    let right = dispatch(&entries[mid..], default)?;
    // Numbers at or above the middle one skip the left subtree.
    let mut out = vec![
        jump(JMP_JGE_K, entries[mid].nr, 0, 1),
        stmt(JMP_JA, len_u32(left.len())?),
    ];
    out.extend(left);
    out.extend(right);
    Ok(out)
}

fn len_u32(len: usize) -> Result<u32, Error> {
    u32::try_from(len).map_err(|_| Error::TooLarge(len))
}

/// A jump target inside one rule's block.
#[derive(Clone, Copy)]
enum To {
    /// This many instructions ahead.
    Ahead(u8),
    /// Past the block: the rule does not hold.
    Fail,
}

/// The checks of one system call's rules: each rule in turn returns `ret`
/// when all its conditions hold; when none does, `default`.
fn conditional(
    lists: &[Vec<Condition>],
    ret: u32,
    default: u32,
) -> Result<Vec<sock_filter>, Error> {
    let mut out = Vec::new();
    for conditions in lists {
        let mut block: Vec<(u16, u32, To, To)> = Vec::new();
        for c in conditions {
            let lo = 16 + 8 * u32::from(c.arg);
            let hi = lo + 4;
            let (v_lo, v_hi) = (c.value as u32, (c.value >> 32) as u32);
            match c.op {
                Op::Eq => block.extend([
                    (LD_W_ABS, hi, To::Ahead(0), To::Ahead(0)),
                    (JMP_JEQ_K, v_hi, To::Ahead(0), To::Fail),
                    (LD_W_ABS, lo, To::Ahead(0), To::Ahead(0)),
                    (JMP_JEQ_K, v_lo, To::Ahead(0), To::Fail),
                ]),
                // Holds when either half differs.
                Op::Ne => block.extend([
                    (LD_W_ABS, hi, To::Ahead(0), To::Ahead(0)),
                    (JMP_JEQ_K, v_hi, To::Ahead(0), To::Ahead(2)),
                    (LD_W_ABS, lo, To::Ahead(0), To::Ahead(0)),
                    (JMP_JEQ_K, v_lo, To::Fail, To::Ahead(0)),
                ]),
                Op::MaskedEq(mask) => {
                    // A half the mask leaves out always matches (the value
                    // lies within the mask: validated).
                    for (offset, m, v) in [(hi, (mask >> 32) as u32, v_hi), (lo, mask as u32, v_lo)]
                    {
                        if m != 0 {
                            block.extend([
                                (LD_W_ABS, offset, To::Ahead(0), To::Ahead(0)),
                                (ALU_AND_K, m, To::Ahead(0), To::Ahead(0)),
                                (JMP_JEQ_K, v, To::Ahead(0), To::Fail),
                            ]);
                        }
                    }
                }
            }
        }
        block.push((RET_K, ret, To::Ahead(0), To::Ahead(0)));
        let len = block.len();
        for (i, (code, k, jt, jf)) in block.into_iter().enumerate() {
            let resolve = |to: To| -> Result<u8, Error> {
                match to {
                    To::Ahead(n) => Ok(n),
                    To::Fail => u8::try_from(len - 1 - i).map_err(|_| Error::TooLarge(len)),
                }
            };
            out.push(jump(code, k, resolve(jt)?, resolve(jf)?));
        }
    }
    out.push(stmt(RET_K, default));
    Ok(out)
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
    hako_sys::raw::seccomp_set_mode_filter(&program.instructions)
        .map_err(|source| Error::Apply { source })
}
