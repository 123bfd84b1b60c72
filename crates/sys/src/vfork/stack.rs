//! The child's stack: mapped once per process, with a guard page below it.

use std::io;

/// A stack for the child, made once and used by every spawn of a process:
/// mapped with a guard page below it, so an overflow faults instead of
/// writing over the parent's memory.
pub struct ChildStack {
    base: *mut libc::c_void,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone; nothing about it is
// tied to the thread that made it.
unsafe impl Send for ChildStack {}

/// The stack's size, guard page included: the child's work is a few system
/// calls and the caller's hook.
const CHILD_STACK: usize = 256 << 10;
const PAGE: usize = 4096;

impl ChildStack {
    /// Maps the stack.
    pub fn new() -> io::Result<ChildStack> {
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing touches no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHILD_STACK,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = ChildStack {
            base,
            len: CHILD_STACK,
        };
        // SAFETY: the lowest page of the mapping just made is ours to
        // protect.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    pub(super) fn top(&self) -> *mut libc::c_void {
        let top = self.base as usize + self.len;
        (top & !15) as *mut libc::c_void
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly the mapping made in `new`, which nothing
        // uses any more (a spawn borrows the stack only while the child
        // shares it, and the child is gone or has exec'd when spawn returns).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

impl std::fmt::Debug for ChildStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildStack")
            .field("len", &self.len)
            .finish()
    }
}
