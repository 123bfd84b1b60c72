//! The guest binary: serves hako on the control socket at fd 3, or, with
//! `--stdio`, on its own stdin and stdout (a container's entrypoint). With
//! `--host-view` it runs on the host instead, to start `runsc` on a root
//! view with host directories bound in (see `hako_gvisor::host_view`).

// Started for every container sandbox: its entry point skips Rust's
// runtime start-up, as `hako`'s does (see `hako_sys::start`).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
hako_sys::entry_point!(run);
// A test build has the test harness's entry point instead.
#[cfg(test)]
const _: fn() -> u8 = run;

use hako_guest::GuestExit;

/// Everything the guest does: its exit code (see [`GuestExit`]).
fn run() -> u8 {
    guest().into()
}

fn guest() -> GuestExit {
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    match args.first().and_then(|a| a.to_str()) {
        Some("--stdio") => return hako_guest::main_stdio(),
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
