//! `hako-guest`: the process that runs inside the boundary.
//!
//! hako starts the guest with a control socket at fd 3 and speaks the framed
//! protocol of [`proto`] to it: a handshake (which, for `linux`, says what
//! sandbox to build first), then any number of commands, each with its own
//! id, live output and exit event, until hako closes the connection. Each
//! command runs under a supervisor forked from the guest: the child
//! subreaper of everything the command spawns, which enforces the deadline
//! and kills and reaps every process the command left behind (including
//! those that called `setsid` or double-forked) before the command is
//! reported as ended.

pub mod client;
mod confine;
mod linux;
mod processes;
pub mod proto;
pub mod sandbox;
mod server;
mod supervise;

/// The guest's entry point: the handshake on `ctl`, then serving commands
/// (from pid 1 of a new `linux` sandbox when the handshake asks for one).
/// Returns the process's exit code.
pub fn main(ctl: std::os::fd::OwnedFd) -> u8 {
    use proto::{FromGuest, ToGuest};
    let ctl = std::os::unix::net::UnixStream::from(ctl);
    let refuse = |message: String| {
        let _ = proto::write_frame(&ctl, &FromGuest::Refused { message });
        2
    };
    let proof = match hako_sys::ns::single_threaded() {
        Ok(proof) => proof,
        Err(err) => return refuse(err.to_string()),
    };
    let hello = match proto::read_frame::<ToGuest>(&ctl) {
        Ok(ToGuest::Hello(hello)) => hello,
        Ok(other) => return refuse(format!("expected the handshake, got {other:?}")),
        Err(err) => return refuse(format!("bad handshake frame: {err}")),
    };
    if hello.version != proto::VERSION {
        return refuse(format!(
            "protocol version {} is not supported; this guest speaks {}",
            hello.version,
            proto::VERSION
        ));
    }
    let _ = hako_sys::stdio_to_null();
    match &hello.linux {
        Some(spec) => linux::start(spec, ctl, &proof),
        None => server::serve(
            ctl,
            &proof,
            server::Mode {
                confinement: None,
                stop_signals: true,
                accept_fds: true,
            },
        ),
    }
}
