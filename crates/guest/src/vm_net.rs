//! A `vm` sandbox's end of the egress path (network mode `allow`).
//!
//! The VM has no NIC. The forwarder (see [`crate::forward`]) connects, as
//! in every sandbox, to the proxy's unix socket; inside a VM that socket
//! is this bridge's, which carries each connection as a stream of
//! [`hako_relay::mux`] over the virtio-serial port named [`PORT_NAME`],
//! whose other end is hako's bridge to the real proxy. The forwarder's
//! first try, handing its connection's descriptor over, is refused (a
//! descriptor cannot leave the VM's kernel), and it relays bytes from then
//! on, as under gVisor.
//!
//! The bridge is a fork of pid 1 made before anything else is forked: it
//! binds the socket, opens the port, then keeps nothing else, holds no
//! capability, cannot gain any and cannot be traced; it dies with pid 1.
//! Killed (a command of the sandbox can), it is not started again: later
//! connections are refused at once, and the sandbox's commands go on.

use std::io::IoSliceMut;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

use hako_relay::mux::Mux;
use hako_sys::ns::{self, Forked};

/// The virtio-serial port the streams go over (`virtserialport,name=`).
pub const PORT_NAME: &str = "hako-net";

/// Binds `socket`, forks the bridge, and returns in pid 1.
pub(crate) fn start(socket: &Path) -> Result<(), String> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    let _ = std::fs::remove_file(socket);
    let listener =
        UnixListener::bind(socket).map_err(|e| format!("bind {}: {e}", socket.display()))?;
    // The forwarder runs as the commands' user.
    std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .map_err(|e| format!("open {} to the forwarder: {e}", socket.display()))?;
    let proof = ns::single_threaded().map_err(|e| format!("fork the network bridge: {e}"))?;
    match ns::fork_single_threaded(&proof) {
        Err(e) => Err(format!("fork the network bridge: {e}")),
        Ok(Forked::Parent(_)) => Ok(()),
        Ok(Forked::Child) => {
            let code = match bridge(listener) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("hako-guest: the network bridge: {e}");
                    1
                }
            };
            hako_sys::spawn::exit_now(code)
        }
    }
}

fn bridge(listener: UnixListener) -> Result<(), String> {
    ns::die_with_parent().map_err(|e| e.to_string())?;
    ns::set_not_dumpable().map_err(|e| e.to_string())?;
    let port = crate::vm::wait_for_port(PORT_NAME)?;
    let port = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| format!("open {}: {e}", port.display()))?;
    hako_sys::confine::set_no_new_privs().map_err(|e| e.to_string())?;
    hako_sys::confine::drop_all_capabilities().map_err(|e| e.to_string())?;
    let out = port.try_clone().map_err(|e| e.to_string())?;
    let mux = Mux::new(Box::new(out));
    let serving = mux.clone();
    std::thread::Builder::new()
        .name("hako-net-demux".into())
        .spawn(move || {
            let _ = serving.serve(port, None);
            // The port is gone: so is the way out.
            hako_sys::spawn::exit_now(0)
        })
        .map_err(|e| e.to_string())?;
    loop {
        let conn = match listener.accept() {
            Ok((conn, _)) => conn,
            Err(_) => {
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let mux = mux.clone();
        let _ = std::thread::Builder::new()
            .name("hako-net-conn".into())
            .spawn(move || carry(&mux, conn));
    }
}

/// One connection of the forwarder's: a handover (a descriptor with its
/// first bytes) is refused, anything else carried.
fn carry(mux: &Mux, conn: UnixStream) {
    use hako_sys::rustix::net::{recvmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut first = vec![0u8; 4096];
    let mut space =
        [std::mem::MaybeUninit::<u8>::uninit(); hako_sys::rustix::cmsg_space!(ScmRights(4))];
    let mut ancillary = RecvAncillaryBuffer::new(&mut space);
    let Ok(got) = recvmsg(
        &conn,
        &mut [IoSliceMut::new(&mut first)],
        &mut ancillary,
        RecvFlags::CMSG_CLOEXEC,
    ) else {
        return;
    };
    let mut handed = false;
    for message in ancillary.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            // Closed as they are dropped.
            handed |= fds.count() > 0;
        }
    }
    if handed {
        let _ = std::io::Write::write_all(&mut &conn, &[hako_relay::handover::NOT_TAKEN]);
        return;
    }
    if got.bytes == 0 {
        return;
    }
    let _ = mux.open(conn, &first[..got.bytes]);
}
