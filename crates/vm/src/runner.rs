//! How QEMU (and `virtiofsd`) are started: as the container backends start their runtime's
//! client (stdio piped), and killed by the kernel when hako ends
//! (`PR_SET_PDEATHSIG`), so that a `kill -9` of hako leaves no VM behind;
//! in a process group of its own, so that a Ctrl-C at hako's terminal is
//! hako's to handle.
//!
//! The kernel sends that signal when the *thread* that forked the child
//! ends, not the process: QEMU is therefore forked by one thread kept for
//! the process's life ([`spawner`]), never by the thread that opens the
//! sandbox (a server's request thread may end while its sandbox lives on).

use std::io;
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use hako_sys::jail::Jail;

type Request = (
    Vec<String>,
    Option<OwnedFd>,
    Option<Prepare>,
    Sender<io::Result<Child>>,
);

/// What is done in a child last, between fork and exec.
#[derive(Debug)]
pub enum Prepare {
    /// QEMU's jail.
    Jail(Jailed),
    /// A mount attached in a mount namespace of the child's own: a
    /// copy-on-write workspace's overlay, at the workspace's path, for
    /// the `virtiofsd` that serves it.
    Attach(hako_sys::detached::Attach),
}

/// How a jailed child is started.
#[derive(Debug)]
pub struct Jailed {
    /// The jail.
    pub jail: Arc<Jail>,
    /// Placed at descriptor 4.
    pub fd4: OwnedFd,
    /// What the jail's RAM file is filled from.
    pub ram_from: Option<OwnedFd>,
}

/// The thread that forks every QEMU and `virtiofsd`, started on first use
/// and never ended.
fn spawner() -> io::Result<Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    if let Some(tx) = SPAWNER.get() {
        return tx
            .lock()
            .map(|tx| tx.clone())
            .map_err(|_| io::Error::other("the VM spawner's lock is poisoned"));
    }
    let (tx, rx) = channel::<Request>();
    std::thread::Builder::new()
        .name("hako-vm-spawner".into())
        .spawn(move || {
            for (argv, fd3, prepare, reply) in rx {
                let _ = reply.send(spawn_here(&argv, fd3, prepare));
            }
            // Every sender is gone only when the process ends; stay alive
            // regardless, since a child's death signal follows this thread.
            loop {
                std::thread::park();
            }
        })?;
    let tx = SPAWNER.get_or_init(|| Mutex::new(tx));
    tx.lock()
        .map(|tx| tx.clone())
        .map_err(|_| io::Error::other("the VM spawner's lock is poisoned"))
}

fn spawn_here(
    argv: &[String],
    fd3: Option<OwnedFd>,
    prepare: Option<Prepare>,
) -> io::Result<Child> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    hako_sys::spawn::prepare(
        &mut cmd,
        hako_sys::spawn::ChildSetup {
            parent_death_kill: true,
            new_process_group: true,
            fd3,
            confine: prepare.map(|prepare| -> hako_sys::spawn::ConfineHook {
                Box::new(move || match &prepare {
                    Prepare::Jail(jailed) => {
                        use std::os::fd::AsRawFd;
                        jailed.jail.enter(
                            Some(jailed.fd4.as_raw_fd()),
                            jailed.ram_from.as_ref().map(AsRawFd::as_raw_fd),
                        )
                    }
                    Prepare::Attach(attach) => attach.enter(),
                })
            }),
            ..Default::default()
        },
    );
    cmd.spawn()
}

/// Starts `argv` (stdio piped, a clean environment, `fd3` at descriptor 3
/// and every other descriptor closed), killed by the kernel when hako
/// ends; `prepare`d last (in QEMU's jail with its descriptor at 4, or
/// with a mount attached).
pub fn spawn_tied(
    argv: &[String],
    fd3: Option<OwnedFd>,
    prepare: Option<Prepare>,
) -> io::Result<Child> {
    let (reply, answer) = channel();
    spawner()?
        .send((argv.to_vec(), fd3, prepare, reply))
        .map_err(|_| io::Error::other("the VM spawner has ended"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the VM spawner did not answer"))?
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        let child =
            std::thread::spawn(|| spawn_tied(&["sleep".to_string(), "30".to_string()], None, None))
                .join()
                .unwrap()
                .unwrap();
        // The asking thread has ended; the child was not sent its death
        // signal (it is still running, not killed).
        let mut child = child;
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child died with the thread"
        );
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
