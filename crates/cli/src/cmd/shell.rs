//! `hako shell`: an interactive shell in a sandbox, on the user's terminal.
//!
//! The shell runs on a pseudo-terminal inside the sandbox. hako puts the
//! user's terminal in raw mode and relays bytes both ways, so Ctrl-C, Ctrl-Z
//! and the like are typed into the sandbox's terminal, whose line
//! discipline turns them into signals for the program there. Window-size
//! changes (SIGWINCH) are forwarded. The user's terminal settings are put
//! back on every way out: the shell's end, SIGTERM or SIGHUP to hako, an
//! error, or a panic (unwinding).

use std::io::Write;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use hako_core::{Command, ExitStatus, Isolation, Sandbox, SpawnOptions, Stream, TermSize};
use hako_sys::rustix::event::{poll, PollFd, PollFlags};
use hako_sys::rustix::termios::{self, OptionalActions, Termios};
use hako_sys::signal::{signum, SignalFd};

use super::SandboxArgs;
use crate::exit;

/// Flags of `hako shell`.
#[derive(Debug, Args)]
pub struct ShellArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Working directory, relative to the workspace.
    #[arg(long, value_name = "REL")]
    cwd: Option<PathBuf>,
    /// The program to run on the terminal [default: bash -i, else sh -i].
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Puts the terminal back as it was when dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(stdin.as_fd())?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(stdin.as_fd(), OptionalActions::Now, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin().as_fd(), OptionalActions::Now, &self.saved);
    }
}

fn size_of_terminal() -> TermSize {
    match termios::tcgetwinsize(std::io::stdout().as_fd()) {
        Ok(w) if w.ws_row > 0 && w.ws_col > 0 => TermSize {
            rows: w.ws_row,
            cols: w.ws_col,
        },
        _ => TermSize { rows: 24, cols: 80 },
    }
}

/// Runs `hako shell`.
pub fn run(args: ShellArgs) -> u8 {
    let fail = |err: &dyn std::fmt::Display| {
        eprintln!("hako: {}", crate::show::message(&err.to_string()));
        exit::SANDBOX_FAILED
    };
    if !termios::isatty(std::io::stdin().as_fd()) {
        return fail(&"hako shell needs a terminal on its standard input; use `hako run` for commands without one");
    }
    // Blocked before any thread starts, so that every thread leaves them to
    // this descriptor and hako can restore the terminal on SIGTERM/SIGHUP.
    let signals = match SignalFd::new(&[signum::SIGWINCH, signum::SIGTERM, signum::SIGHUP]) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    let plan = match args.sandbox.plan() {
        Ok(plan) => plan,
        Err(e) => return fail(&e),
    };
    // The backend is chosen and the policy gate passed first; a
    // copy-on-write workspace's layers are held by the sandbox until the
    // shell ends.
    let opened =
        hako_runtime::Opener::from_plan(plan, Isolation::None).and_then(|opener| opener.open());
    let sandbox: Arc<dyn Sandbox> = match opened {
        Ok(sb) => Arc::from(sb),
        Err(e) => return fail(&e),
    };
    let code = match session(&sandbox, args.command, args.cwd, &signals) {
        Ok(code) => code,
        Err(e) => fail(&e),
    };
    let _ = sandbox.close();
    drop(sandbox);
    code
}

/// The shell's life, with the terminal in raw mode; returns hako's exit
/// code.
fn session(
    sandbox: &Arc<dyn Sandbox>,
    command: Vec<String>,
    cwd: Option<PathBuf>,
    signals: &SignalFd,
) -> Result<u8, hako_core::Error> {
    let processes = sandbox
        .processes()
        .ok_or_else(|| hako_core::Error::Unsupported {
            backend: sandbox.capabilities().backend.clone(),
            capability: "terminals",
        })?;
    let mut command = if command.is_empty() {
        Command::shell("if command -v bash >/dev/null 2>&1; then exec bash -i; else exec sh -i; fi")
    } else {
        Command::new(command)
    };
    command.cwd = cwd;
    let term = std::env::var("TERM").unwrap_or_else(|_| "xterm-256color".into());
    command = command.env("TERM", term);
    let id = processes.spawn(
        &command,
        &SpawnOptions {
            pty: Some(size_of_terminal()),
            ..SpawnOptions::default()
        },
    )?;
    let (done_r, done_w) = hako_sys::rustix::pipe::pipe().map_err(|e| hako_core::Error::Io {
        op: "create a pipe",
        source: e.into(),
    })?;
    // Output: a thread waits on the sandbox and writes to the terminal.
    let relay = {
        let sandbox = Arc::clone(sandbox);
        std::thread::spawn(move || {
            let mut offset = 0;
            let mut stdout = std::io::stdout();
            while let Some(p) = sandbox.processes() {
                let Ok(slice) = p.read_output(
                    id,
                    Stream::Stdout,
                    offset,
                    64 << 10,
                    Some(Duration::from_secs(1)),
                ) else {
                    break;
                };
                if !slice.data.is_empty() {
                    let _ = stdout.write_all(&slice.data).and_then(|()| stdout.flush());
                }
                offset = slice.next;
                if slice.ended {
                    break;
                }
            }
            let _ = hako_sys::rustix::io::write(&done_w, b"x");
        })
    };
    let raw = RawMode::enter().map_err(|source| hako_core::Error::Io {
        op: "put the terminal in raw mode",
        source,
    })?;
    let stdin = std::io::stdin();
    let mut buf = vec![0u8; 4096];
    let mut stdin_open = true;
    loop {
        let mut fds = vec![
            PollFd::new(signals, PollFlags::IN),
            PollFd::new(&done_r, PollFlags::IN),
        ];
        if stdin_open {
            fds.push(PollFd::new(&stdin, PollFlags::IN));
        }
        match poll(&mut fds, None) {
            Ok(_) | Err(hako_sys::rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
        let ready: Vec<bool> = fds.iter().map(|f| !f.revents().is_empty()).collect();
        drop(fds);
        if ready[0] {
            let got = signals.drain();
            if got.contains(&signum::SIGWINCH) {
                let _ = processes.resize(id, size_of_terminal());
            }
            if got
                .iter()
                .any(|&s| s == signum::SIGTERM || s == signum::SIGHUP)
            {
                let _ = processes.kill(id);
            }
        }
        if ready[1] {
            break;
        }
        if stdin_open && ready.get(2).copied().unwrap_or(false) {
            match hako_sys::rustix::io::read(&stdin, &mut buf[..]) {
                Ok(0) | Err(_) => {
                    stdin_open = false;
                    let _ = processes.close_stdin(id);
                }
                Ok(n) => {
                    let _ = processes.write_stdin(id, &buf[..n]);
                }
            }
        }
    }
    drop(raw);
    let _ = relay.join();
    let state = processes.wait(id, Some(Duration::from_secs(10)))?;
    Ok(match state.status {
        Some(ExitStatus::Code(c)) => u8::try_from(c).unwrap_or(1),
        Some(ExitStatus::Signal(s)) => u8::try_from(128 + s).unwrap_or(1),
        None => {
            if let Some(error) = state.error {
                // The guest's words: escaped.
                eprintln!("hako: {}", crate::show::message(&error));
            }
            exit::SANDBOX_FAILED
        }
    })
}
