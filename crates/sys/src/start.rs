//! What a process needs before its own code runs, for an executable whose
//! entry point skips Rust's runtime start-up (`#![no_main]`).
//!
//! Rust's runtime, before `main`, makes sure descriptors 0, 1 and 2 are
//! open, ignores SIGPIPE, and finds where the main thread's stack ends so
//! that overflowing it prints a message. That last step reads the whole of
//! `/proc/self/maps`, which is about a tenth of a short-lived command's
//! start (measured on hako's CLI: 0.15 ms of 1.2 ms for a program that
//! prints one line). [`runtime_start`] does the first two; an overflow of
//! the main thread's stack still stops the process (SIGSEGV on the guard
//! gap), only without the message.

use std::io;

/// Makes sure descriptors 0, 1 and 2 are open, on `/dev/null` for any that
/// is closed (so that no file the process opens later takes the number of
/// one and receives what is printed), and ignores SIGPIPE (a write to a
/// closed pipe or socket then fails with EPIPE rather than killing the
/// process). Call it first thing, from the entry point.
pub fn runtime_start() -> io::Result<()> {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    // SAFETY: `fds` is an array of three initialised pollfd structures that
    // poll reads and writes back, and no timeout makes it wait.
    let polled = unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) };
    for pfd in &fds {
        let closed = if polled < 0 {
            // poll could not run (no memory): ask about each descriptor.
            // SAFETY: F_GETFD only reads the descriptor's flags.
            let flags = unsafe { libc::fcntl(pfd.fd, libc::F_GETFD) };
            flags < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EBADF)
        } else {
            pfd.revents & libc::POLLNVAL != 0
        };
        if closed {
            // The lowest free number is this one: 0, 1 and 2 are taken in
            // order.
            let null = rustix::fs::open(
                "/dev/null",
                rustix::fs::OFlags::RDWR,
                rustix::fs::Mode::empty(),
            )?;
            let got = std::os::fd::IntoRawFd::into_raw_fd(null);
            if got != pfd.fd {
                return Err(io::Error::other(format!(
                    "/dev/null opened as descriptor {got}, not the closed {}",
                    pfd.fd
                )));
            }
        }
    }
    // SAFETY: SIG_IGN installs no handler and touches no memory of ours.
    if unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Defines the executable's C entry point `main`, which runs
/// [`runtime_start`] and then `$run` (a function returning the exit code),
/// in place of Rust's runtime start-up (use with `#![no_main]`). A panic
/// in `$run` prints its message and exits with code 101, as a panic in
/// Rust's `main` does; standard output is flushed at exit.
///
/// It is defined here, with the crate's other `unsafe` code, because an
/// unmangled symbol is what the `unsafe_code` lint guards against (two
/// symbols of one name): `main` is the one a C program must have, and an
/// executable uses this macro once.
#[macro_export]
macro_rules! entry_point {
    ($run:path) => {
        /// The C entry point: see `hako_sys::entry_point!`.
        #[no_mangle]
        pub extern "C" fn main(
            _argc: ::std::ffi::c_int,
            _argv: *const *const ::std::ffi::c_char,
        ) -> ::std::ffi::c_int {
            $crate::start::run_main($run)
        }
    };
}

/// The body of [`entry_point!`]'s `main`.
pub fn run_main(run: fn() -> u8) -> ! {
    if let Err(e) = runtime_start() {
        let program = std::env::args().next().unwrap_or_default();
        eprintln!("{program}: cannot start: {e}");
        std::process::exit(125);
    }
    let code = std::panic::catch_unwind(run).unwrap_or(101);
    // `exit` flushes standard output, as returning from Rust's `main` would.
    std::process::exit(i32::from(code))
}
