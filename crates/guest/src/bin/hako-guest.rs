//! The guest binary: serves hako on the control socket at fd 3, or, with
//! `--stdio`, on its own stdin and stdout (a container's entrypoint). With
//! `--host-view` it runs on the host instead, to start `runsc` on a root
//! view with host directories bound in (see `hako_guest::host_view`).

// Started for every container sandbox: its entry point skips Rust's
// runtime start-up, as `hako`'s does (see `hako_sys::start`).
#![cfg_attr(not(test), no_main)]

#[cfg(not(test))]
hako_sys::entry_point!(run);
// A test build has the test harness's entry point instead.
#[cfg(test)]
const _: fn() -> u8 = run;

/// Everything the guest does: its exit code.
fn run() -> u8 {
    let first = std::env::args_os().nth(1);
    if first.as_deref() == Some("--stdio".as_ref()) {
        return hako_guest::main_stdio();
    }
    if first.as_deref() == Some(hako_guest::host_view::FLAG.as_ref()) {
        let rest: Vec<_> = std::env::args_os().skip(2).collect();
        return hako_guest::host_view::main(&rest);
    }
    let ctl = match hako_sys::take_inherited_fd(3) {
        Ok(fd) => fd,
        Err(err) => {
            eprintln!("hako-guest: no control socket at fd 3 ({err}) and no --stdio; this program is started by hako, not by hand");
            return 2;
        }
    };
    hako_guest::main(ctl)
}
