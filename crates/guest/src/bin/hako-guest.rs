//! The guest binary: serves hako on the control socket at fd 3, or, with
//! `--stdio`, on its own stdin and stdout (a container's entrypoint).

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--stdio") {
        return ExitCode::from(hako_guest::main_stdio());
    }
    let ctl = match hako_sys::take_inherited_fd(3) {
        Ok(fd) => fd,
        Err(err) => {
            eprintln!("hako-guest: no control socket at fd 3 ({err}) and no --stdio; this program is started by hako, not by hand");
            return ExitCode::from(2);
        }
    };
    ExitCode::from(hako_guest::main(ctl))
}
