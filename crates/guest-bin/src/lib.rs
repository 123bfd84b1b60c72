//! What the `hako-guest` executable does, as a function: serve hako on
//! the control socket at fd 3, or, with `--stdio`, on its own stdin and
//! stdout (a container's entrypoint); with `--host-view`, run on the host
//! instead, to start `runsc` on a root view with host directories bound in
//! (see `hako_gvisor::host_view`).
//!
//! Two executables call [`main`]: `hako-guest` itself, and `hako` when it
//! is started under one of the guest's names ([`is_guest_name`]), so that
//! a `hako` installed alone carries its guest.

use std::ffi::OsStr;
use std::path::Path;

use hako_guest::GuestExit;

/// The names a program answers to as the guest: `hako-guest`, the static
/// guest's `hako-guest-static`, and the guest's file inside a container
/// (`hako_container::GUEST_INSIDE`, `/.hako-guest`).
pub const GUEST_NAMES: [&str; 3] = ["hako-guest", "hako-guest-static", ".hako-guest"];

/// Whether `argv0` (a path or a bare name) names the guest: its last
/// component is one of [`GUEST_NAMES`].
pub fn is_guest_name(argv0: &OsStr) -> bool {
    Path::new(argv0)
        .file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|name| GUEST_NAMES.contains(&name))
}

/// Everything the guest does, with this process's arguments: its exit
/// code (see [`GuestExit`]).
pub fn main() -> u8 {
    guest().into()
}

fn guest() -> GuestExit {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("--stdio") => return hako_guest::main_stdio(),
        Some(hako_guest::vm::FLAG) => return hako_guest::vm::main_vm(),
        Some(hako_gvisor::host_view::FLAG) => return hako_gvisor::host_view::main(&args[1..]),
        _ => {}
    }
    let ctl = match hako_sys::take_inherited_fd(3) {
        Ok(fd) => fd,
        Err(err) => {
            eprintln!("hako-guest: no control socket at fd 3 ({err}) and no --stdio; this program is started by hako, not by hand");
            return GuestExit::Handshake;
        }
    };
    hako_guest::main(ctl)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guest_s_names_are_told_from_hako_s() {
        for yes in [
            "hako-guest",
            "/usr/local/bin/hako-guest",
            "target/release/hako-guest-static",
            "/.hako-guest",
        ] {
            assert!(is_guest_name(OsStr::new(yes)), "{yes}");
        }
        for no in ["hako", "/usr/bin/hako", "hako-guest-x", "", "/", "guest"] {
            assert!(!is_guest_name(OsStr::new(no)), "{no}");
        }
    }
}
