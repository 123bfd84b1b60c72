//! How QEMU is started: as the container backends start their runtime's
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
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

type Request = (
    Vec<String>,
    Vec<(String, String)>,
    Sender<io::Result<Child>>,
);

/// The thread that forks every QEMU, started on first use and never ended.
fn spawner() -> io::Result<Sender<Request>> {
    static SPAWNER: OnceLock<Mutex<Sender<Request>>> = OnceLock::new();
    if let Some(tx) = SPAWNER.get() {
        return tx
            .lock()
            .map(|tx| tx.clone())
            .map_err(|_| io::Error::other("the QEMU spawner's lock is poisoned"));
    }
    let (tx, rx) = channel::<Request>();
    std::thread::Builder::new()
        .name("hako-vm-spawner".into())
        .spawn(move || {
            for (argv, env, reply) in rx {
                let _ = reply.send(spawn_here(&argv, &env));
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
        .map_err(|_| io::Error::other("the QEMU spawner's lock is poisoned"))
}

fn spawn_here(argv: &[String], env: &[(String, String)]) -> io::Result<Child> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    hako_sys::spawn::prepare(
        &mut cmd,
        hako_sys::spawn::ChildSetup {
            parent_death_kill: true,
            new_process_group: true,
            ..Default::default()
        },
    );
    cmd.spawn()
}

use hako_container::runner::{CliRunner, RunOutput, Runner};

/// Runs QEMU for real, tied to hako's life.
#[derive(Debug, Default, Clone, Copy)]
pub struct QemuRunner;

impl Runner for QemuRunner {
    fn output(&self, argv: &[String]) -> io::Result<RunOutput> {
        CliRunner.output(argv)
    }

    fn spawn(&self, argv: &[String]) -> io::Result<Child> {
        self.spawn_with_env(argv, &[])
    }

    fn spawn_with_env(&self, argv: &[String], env: &[(String, String)]) -> io::Result<Child> {
        let (reply, answer) = channel();
        spawner()?
            .send((argv.to_vec(), env.to_vec(), reply))
            .map_err(|_| io::Error::other("the QEMU spawner has ended"))?;
        answer
            .recv()
            .map_err(|_| io::Error::other("the QEMU spawner did not answer"))?
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_child_outlives_the_thread_that_asked_for_it() {
        let child =
            std::thread::spawn(|| QemuRunner.spawn(&["sleep".to_string(), "30".to_string()]))
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
