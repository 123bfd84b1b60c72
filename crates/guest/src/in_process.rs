//! The guest's entry points for a host process that links it and starts
//! it in a fork of itself rather than by executing `hako-guest` (the
//! `hako` CLI, through the `linux` and `host` backends): the driver never
//! calls the guest's code itself; it is handed these functions as a value
//! (`hako_driver::InProcessGuest`) by whoever links both.

use std::error::Error;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use hako_sys::ns::SingleThreaded;

use crate::proto::LinuxSpec;
use crate::GuestExit;

/// In the child of a fork of a single-threaded host process: becomes the
/// guest (in `cwd`, in a process group of its own, with `ctl` at fd 3,
/// stdio on `/dev/null` and no other descriptor, disguised as
/// `hako-guest`), serves `ctl`, and returns the exit code.
pub fn serve_forked(cwd: OwnedFd, ctl: UnixStream) -> u8 {
    let code = match hako_sys::spawn::become_forked_helper(Some(cwd.as_fd()), ctl.as_fd()) {
        Ok(fd3) => {
            // Their descriptors were closed with every other one.
            std::mem::forget(cwd);
            std::mem::forget(ctl);
            // Inside a sandbox pid 1 is this process: it must not show
            // hako's command line or environment there.
            match hako_sys::proc::disguise_as("hako-guest") {
                Ok(()) => crate::main(fd3),
                Err(_) => GuestExit::Disguise,
            }
        }
        Err(_) => GuestExit::SetUp,
    };
    code.into()
}

/// Creates pid 1 of a new `linux` sandbox as a child of this
/// (single-threaded) process, which stays outside its namespaces as the
/// launcher: pid 1 builds the view `spec` describes and serves `ctl`,
/// answering `Ready` or `Refused` first. Returns pid 1's pid.
pub fn spawn_linux_pid1(
    spec: &LinuxSpec,
    ctl: &UnixStream,
    proof: &SingleThreaded,
) -> Result<i32, Box<dyn Error + Send + Sync>> {
    crate::namespaces::spawn_pid1(spec, ctl, proof).map_err(Into::into)
}
