//! `hako-guest`: the process that runs inside the boundary.
//!
//! hako starts the guest with a control socket at fd 3 and speaks the framed
//! protocol of [`proto`] to it: a handshake (which, for `linux`, says what
//! sandbox to build first), then any number of commands, each with its own
//! id, live output and exit event, until hako closes the connection. Each
//! command runs under a supervisor forked from the guest (and kept for the
//! commands after it): the child subreaper of everything the command
//! spawns, which enforces the deadline and kills and reaps every process
//! the command left behind (including those that called `setsid` or
//! double-forked) before the command is reported as ended.
//!
//! What goes wrong is a [`GuestError`] (its message is what hako is told,
//! in a `Refused` or `Failed` frame); how each of the guest's processes
//! exits is a [`GuestExit`].

mod error;
mod exit;
mod forward;
pub mod in_process;
mod lockdown;
mod namespaces;
/// The wire protocol, shared with hako's side (the `hako-proto` crate).
pub use hako_proto as proto;
mod seal;
mod server;
mod supervise;
pub mod vm;
mod vm_net;
mod zygote;

pub use error::{GuestError, Source};
pub use exit::GuestExit;

/// The guest's entry point: the handshake on `ctl`, then serving commands
/// (from pid 1 of a new `linux` sandbox when the handshake asks for one).
/// Returns the process's exit code.
pub fn main(ctl: std::os::fd::OwnedFd) -> GuestExit {
    let stream = std::os::unix::net::UnixStream::from(ctl);
    match server::Link::socket(stream) {
        Ok(link) => serve_link(link),
        Err(_) => GuestExit::Handshake,
    }
}

/// The guest's entry point over its own stdin and stdout (for a guest
/// started where hako's socket cannot reach, such as a container's
/// entrypoint): frames are read from stdin and written to stdout. A guest
/// reached this way does not share hako's view, so it accepts no
/// descriptor and builds no `linux` sandbox.
pub fn main_stdio() -> GuestExit {
    use std::os::fd::AsFd;
    let (Ok(input), Ok(output)) = (
        std::io::stdin().as_fd().try_clone_to_owned(),
        std::io::stdout().as_fd().try_clone_to_owned(),
    ) else {
        return GuestExit::Handshake;
    };
    // From here the link has its own descriptors; the process's stdio goes
    // to /dev/null so that nothing it starts can write into the link.
    if hako_sys::stdio_to_null().is_err() {
        return GuestExit::Handshake;
    }
    serve_link(server::Link::pipes(input, output))
}

fn serve_link(ctl: server::Link) -> GuestExit {
    // Once for every command below: an "ignore" inherited from whoever
    // started hako would survive into them (Ctrl-C could not stop one).
    let _ = hako_sys::signal::restore_ignored_signals();
    let refuse = |ctl: &server::Link, err: GuestError| {
        let _ = ctl.write_frame(&proto::FromGuest::Refused {
            message: err.to_string(),
            errno: err.errno(),
        });
        GuestExit::Handshake
    };
    let proof = match hako_sys::ns::single_threaded() {
        Ok(proof) => proof,
        Err(err) => return refuse(&ctl, GuestError::NotSingleThreaded(err)),
    };
    let hello = match handshake(&ctl) {
        Ok(hello) => hello,
        Err(err) => return refuse(&ctl, err),
    };
    let _ = hako_sys::stdio_to_null();
    let accept_fds = ctl.is_socket();
    // As a container's init, SIGINT, SIGTERM and SIGHUP can only come from
    // a command inside (the runtime stops the guest by closing its stdin):
    // not a reason to end every other command.
    let init = std::process::id() == 1;
    match &hello.linux {
        Some(spec) => match ctl.into_socket() {
            Some(stream) => namespaces::start(spec, stream, &proof),
            None => GuestExit::Handshake,
        },
        None => {
            // Opened before the seal hides or forbids anything.
            let oom = match hello.memory.as_ref().map(server::memory::Oom::open) {
                None => None,
                Some(Ok(oom)) => Some(oom),
                Some(Err(err)) => return refuse(&ctl, err),
            };
            // A guest with no namespace of its own (landlock): its
            // cgroups, its commands' ruleset and filters, and the default
            // filter on itself, before anything is started.
            let confinement = match hello.confine.as_ref().map(confine_here) {
                None => None,
                Some(Ok(confinement)) => Some(confinement),
                Some(Err(err)) => return refuse(&ctl, err),
            };
            // First of all, what the runtime left to the guest: masks,
            // then no capability and the seccomp filter.
            if let Some(seal) = &hello.seal {
                if let Err(err) = seal::apply(seal) {
                    return refuse(&ctl, error::failed("seal the sandbox")(err));
                }
            }
            // Commands run as the guest's uid (in a container, the invoking
            // user's): none may open the guest's descriptors through
            // /proc/PID/fd (its link to hako among them) or trace it. A
            // command's exec makes it dumpable again. (A linux sandbox's
            // pid 1 is out of the commands' reach by its capabilities, and
            // must stay dumpable for its launcher to map its ids.)
            let _ = hako_sys::ns::set_not_dumpable();
            if init {
                // Linux shields a namespace's init from its signals; gVisor
                // does not.
                let _ = hako_sys::signal::block_terminating_signals();
            }
            let forwarder = match hello.network.as_ref().map(|n| forward::start(n, &proof)) {
                None => None,
                Some(Ok(pid)) => Some(pid),
                Some(Err(err)) => return refuse(&ctl, err),
            };
            server::serve(
                ctl,
                &proof,
                server::Mode {
                    confinement,
                    stop_signals: !init,
                    accept_fds,
                    forwarder,
                    oom,
                },
            )
        }
    }
}

/// Confines a guest that serves where it is as `spec` says: joins its
/// cgroups, builds what every supervisor enforces, and installs the
/// default seccomp policy on itself (see [`lockdown::Confinement::shared`]).
fn confine_here(spec: &proto::ConfineSpec) -> Result<lockdown::Confinement, GuestError> {
    let pid = hako_sys::rustix::process::getpid().as_raw_nonzero().get();
    namespaces::join_cgroups(&spec.cgroup_procs, pid)?;
    let mut confinement = lockdown::Confinement::shared(spec)?;
    confinement.seal_guest()?;
    Ok(confinement)
}

/// Reads the handshake on `ctl` and checks that this guest can do what it
/// asks.
fn handshake(ctl: &server::Link) -> Result<Box<proto::Hello>, GuestError> {
    let hello = match ctl.read_frame::<proto::ToGuest>() {
        Ok(proto::ToGuest::Hello(hello)) => hello,
        Ok(other) => {
            return Err(GuestError::NoHandshake {
                got: format!("{other:?}"),
            })
        }
        Err(err) => return Err(GuestError::BadHandshake(err)),
    };
    if hello.version != proto::VERSION {
        return Err(GuestError::Version {
            asked: hello.version,
            speaks: proto::VERSION,
        });
    }
    if hello.linux.is_some() && hello.seal.is_some() {
        // A linux sandbox's pid 1 confines itself from its own spec; a
        // seal here would be a caller's mistake, never silently ignored.
        return Err(GuestError::SealWithLinux);
    }
    if hello.confine.is_some() && (hello.linux.is_some() || hello.seal.is_some()) {
        // One confinement per guest: its own (a host process's), a linux
        // sandbox's pid 1's, or a container's seal.
        return Err(GuestError::ConfineWithOther);
    }
    if hello.linux.is_some() && !ctl.is_socket() {
        return Err(GuestError::LinuxOverPipes);
    }
    Ok(hello)
}
