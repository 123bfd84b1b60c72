//! A classic-BPF interpreter for the instructions seccomp filters use, to
//! test what a compiled program decides without installing it.

use libc::sock_filter;

/// Runs `program` on a `struct seccomp_data` (little-endian) and returns the
/// seccomp return value. Panics on an instruction it does not know, a jump
/// out of the program, or falling off its end: the kernel's verifier would
/// reject such a program.
pub(crate) fn run(program: &[sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
    let word = |offset: u32| -> u32 {
        match offset {
            0 => nr,
            4 => arch,
            8 | 12 => 0, // instruction pointer
            16..=60 if offset % 4 == 0 => {
                let arg = args[((offset - 16) / 8) as usize];
                if offset % 8 == 0 {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => panic!("load from offset {offset}"),
        }
    };
    let mut acc: u32 = 0;
    let mut pc: usize = 0;
    loop {
        let insn = &program[pc];
        pc += 1;
        let cond = |taken: bool| if taken { insn.jt } else { insn.jf } as usize;
        match insn.code {
            0x20 => acc = word(insn.k),            // ld  [k]
            0x54 => acc &= insn.k,                 // and #k
            0x05 => pc += insn.k as usize,         // ja  +k
            0x15 => pc += cond(acc == insn.k),     // jeq #k
            0x25 => pc += cond(acc > insn.k),      // jgt #k
            0x35 => pc += cond(acc >= insn.k),     // jge #k
            0x45 => pc += cond(acc & insn.k != 0), // jset #k
            0x06 => return insn.k,                 // ret #k
            code => panic!("unknown BPF opcode {code:#x} at {}", pc - 1),
        }
    }
}
