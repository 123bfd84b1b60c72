//! How QEMU is started: as the container backends start their runtime's
//! client (stdio piped), and killed by the kernel when the thread of hako
//! that started it ends (`PR_SET_PDEATHSIG`), so that a `kill -9` of hako
//! leaves no VM behind; in a process group of its own, so that a Ctrl-C
//! at hako's terminal is hako's to handle.

use std::io;
use std::process::{Child, Command, Stdio};

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
}
