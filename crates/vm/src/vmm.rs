//! What hako needs of a virtual machine monitor: one small driver behind
//! these traits, the rest of the launcher (the shares' daemons, the boot
//! line, snapshots kept and chosen, what the sandbox enforces) written
//! once. QEMU is the driver here ([`crate::qemu`]); what a Firecracker or
//! Cloud Hypervisor driver would need is in the README.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use hako_container::StderrTail;
use hako_core::Result;

/// A VMM.
pub trait Vmm: Send + Sync + std::fmt::Debug {
    /// Starts the VMM, its stdin and stdout the guest's link: booting the
    /// guest (paused before its first instruction when `paused`, so that
    /// devices can be added first), or, with `memory` (a snapshot's memory
    /// file), waiting for the snapshot's state
    /// ([`VmmControl::restore`]).
    fn spawn(&self, memory: Option<OwnedFd>, paused: bool) -> Result<VmProcess>;
}

/// Control of one running VMM.
pub trait VmmControl: Send + std::fmt::Debug {
    /// Waits until the guest has opened its link (it then waits for its
    /// boot line).
    fn wait_guest_ready(&mut self, within: Duration) -> io::Result<()>;
    /// Loads a snapshot's state (its memory was given at the spawn) and
    /// runs the VM.
    fn restore(&mut self, state: &std::fs::File) -> io::Result<()>;
    /// Pauses the VM and keeps its snapshot at `path` (the state there,
    /// the memory beside it: [`crate::launcher::ram_path`]), named only
    /// once complete. The caller resumes the VM.
    fn save(&mut self, path: &Path) -> io::Result<()>;
    /// Runs the VM (paused at its spawn, or for a save).
    fn resume(&mut self) -> io::Result<()>;
    /// Adds the virtio-fs device of share `index`, with `tag`, served by
    /// the daemon at the other end of `socket`.
    fn add_share(&mut self, index: usize, tag: &str, socket: &UnixStream) -> io::Result<()>;
    /// Adds a second link to the guest, named `name` (a virtio-serial
    /// port, or what the VMM has in its place), its host end `socket`.
    fn add_port(&mut self, name: &str, socket: &UnixStream) -> io::Result<()>;
}

/// A VMM started.
#[derive(Debug)]
pub struct VmProcess {
    /// The process (its stdio the guest's link).
    pub child: std::process::Child,
    /// Its control.
    pub control: Box<dyn VmmControl>,
    /// What it and the guest's console say.
    pub tail: Tails,
}

/// What a VM says: its console (the kernel's and the guest's messages),
/// and the VMM's own stderr.
#[derive(Debug)]
pub struct Tails {
    /// The console.
    pub console: StderrTail,
    /// The VMM's stderr.
    pub vmm: StderrTail,
}

impl Tails {
    /// Both, the VMM's first, waiting at most `wait` for each to end.
    pub fn text(&self, wait: Duration) -> String {
        let vmm = self.vmm.text(wait);
        let console = self.console.text(wait);
        match (vmm.trim().is_empty(), console.trim().is_empty()) {
            (true, _) => console,
            (false, true) => vmm,
            (false, false) => format!("{}\n{}", vmm.trim_end(), console),
        }
    }
}
