//! How the container backends run their runtime's CLI: through a
//! [`Runner`], so that tests can record the exact argv without a daemon.

use std::fmt::Debug;
use std::io;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// What a finished runtime command printed.
#[derive(Debug, Clone, Default)]
pub struct RunOutput {
    /// Whether it exited with status 0.
    pub success: bool,
    /// Its stdout.
    pub stdout: Vec<u8>,
    /// Its stderr.
    pub stderr: Vec<u8>,
}

impl RunOutput {
    /// stderr (or stdout when stderr is empty), trimmed, for a message.
    pub fn message(&self) -> String {
        let text = if self.stderr.iter().all(u8::is_ascii_whitespace) {
            &self.stdout
        } else {
            &self.stderr
        };
        String::from_utf8_lossy(text).trim().to_string()
    }
}

/// Runs a container runtime's commands.
pub trait Runner: Send + Sync + Debug {
    /// Runs `argv` to completion with no input.
    fn output(&self, argv: &[String]) -> io::Result<RunOutput>;

    /// Starts `argv` with stdin, stdout and stderr piped (the container's
    /// guest is reached through its stdio).
    fn spawn(&self, argv: &[String]) -> io::Result<Child>;

    /// As [`spawn`](Runner::spawn), with `env` added to the process's
    /// environment (values a `docker exec --env NAME` takes from it).
    fn spawn_with_env(&self, argv: &[String], env: &[(String, String)]) -> io::Result<Child>;
}

/// Runs commands for real.
#[derive(Debug, Default, Clone, Copy)]
pub struct CliRunner;

fn command(argv: &[String]) -> io::Result<Command> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args);
    Ok(cmd)
}

impl Runner for CliRunner {
    fn output(&self, argv: &[String]) -> io::Result<RunOutput> {
        let out = command(argv)?.stdin(Stdio::null()).output()?;
        Ok(RunOutput {
            success: out.status.success(),
            stdout: out.stdout,
            stderr: out.stderr,
        })
    }

    fn spawn(&self, argv: &[String]) -> io::Result<Child> {
        self.spawn_with_env(argv, &[])
    }

    fn spawn_with_env(&self, argv: &[String], env: &[(String, String)]) -> io::Result<Child> {
        command(argv)?
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
    }
}

/// A runner for tests: records every argv and answers from a script (the
/// first rule whose words all appear in the argv, in order, wins);
/// anything else succeeds with no output. `spawn` runs `spawn_with`
/// instead of the recorded argv, when set.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every argv run or spawned, in order.
    pub calls: Mutex<Vec<Vec<String>>>,
    /// `(words, answer)` rules.
    pub script: Vec<(Vec<String>, RunOutput)>,
    /// What `spawn` really starts.
    pub spawn_with: Option<Vec<String>>,
}

impl Recorder {
    /// A copy of the calls so far.
    pub fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn record(&self, argv: &[String]) {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(argv.to_vec());
        }
    }
}

fn contains_in_order(argv: &[String], words: &[String]) -> bool {
    let mut rest = argv.iter();
    words.iter().all(|w| rest.any(|a| a == w))
}

impl Runner for Recorder {
    fn output(&self, argv: &[String]) -> io::Result<RunOutput> {
        self.record(argv);
        Ok(self
            .script
            .iter()
            .find(|(words, _)| contains_in_order(argv, words))
            .map(|(_, out)| out.clone())
            .unwrap_or(RunOutput {
                success: true,
                ..RunOutput::default()
            }))
    }

    fn spawn_with_env(&self, argv: &[String], _env: &[(String, String)]) -> io::Result<Child> {
        self.spawn(argv)
    }

    fn spawn(&self, argv: &[String]) -> io::Result<Child> {
        self.record(argv);
        match &self.spawn_with {
            Some(real) => CliRunner.spawn(real),
            None => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the recorder starts nothing",
            )),
        }
    }
}
