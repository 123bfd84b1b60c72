//! The guest binary: serves hako on the control socket at fd 3.

use std::process::ExitCode;

fn main() -> ExitCode {
    let ctl = match hako_sys::take_inherited_fd(3) {
        Ok(fd) => fd,
        Err(err) => {
            eprintln!("hako-guest: no control socket at fd 3 ({err}); this program is started by hako, not by hand");
            return ExitCode::from(2);
        }
    };
    ExitCode::from(hako_guest::main(ctl))
}
