//! `docker exec` mode: the fallback for images where the static guest
//! cannot run (another architecture, a runtime that refuses the bind).
//!
//! The container is the same locked-down one, kept up by the runtime's init
//! and the image's `sleep`; each command is a `docker exec` (tens of
//! milliseconds each, against about one for a round trip to the guest).
//! Without the guest inside, this mode is weaker, and says so: no sessions,
//! processes, terminals or streamed output; a process a command leaves in
//! the background keeps running until the sandbox closes; and a deadline
//! restarts the container, which kills everything running in it.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hako_core::{
    Capabilities, Command, DirListing, Error, ExitStatus, Optional, Output, Result, Sandbox,
};
use hako_driver::connection::Capture;
use hako_fence::Fence;

use hako_container::engine::Engine;
use hako_container::runner::Runner;

/// How long a `docker exec` that has not started within the deadline's
/// restart may take to go away before it is killed.
const EXEC_GRACE: Duration = Duration::from_secs(5);

/// A sandbox whose commands each run through `docker exec`.
#[derive(Debug)]
pub struct DockerExecSandbox {
    pub(crate) engine: Arc<Engine>,
    pub(crate) runner: Arc<dyn Runner>,
    pub(crate) name: String,
    pub(crate) fence: Fence,
    pub(crate) caps: Capabilities,
    pub(crate) base_env: Vec<(String, String)>,
    pub(crate) max_output: usize,
    pub(crate) workspace: PathBuf,
    pub(crate) user: (u32, u32),
    pub(crate) closed: AtomicBool,
    /// The seccomp profile file, kept until close.
    pub(crate) keep: Mutex<Option<tempfile::NamedTempFile>>,
}

/// What the optional accessors offer in this mode: the fence's file
/// operations, nothing that needs the guest.
pub(crate) const EXEC_MODE_OPTIONAL: Optional = Optional {
    read_limit: false,
    append: false,
    make_dir_all: false,
    workdir: false,
    stat: false,
    exec_stream: false,
    sessions: false,
    processes: false,
};

fn backend_err(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: crate::NAME.into(),
        op,
        message: message.into(),
    }
}

/// The `docker exec` argv for one command: environment variables by name
/// only (their values travel in the client's environment, never on a
/// command line other users can read); stdin always attached (hako closes
/// it at once when the command has no input). Without `--interactive`
/// the command's stdin would be the host's `/dev/null`, which some engine
/// versions hand to the exec'd user by changing the owner of the host's
/// own `/dev/null` (Podman 4.3 with runc, as Debian 12 ships them; runc
/// 1.1.3 and 1.1.4 under Docker).
pub fn exec_argv(
    engine: &Engine,
    container: &str,
    cwd: &Path,
    user: (u32, u32),
    env_names: &[&str],
    argv: &[String],
) -> Vec<String> {
    let mut a: Vec<String> = vec!["exec".into(), "--interactive".into()];
    a.extend([
        "--workdir".into(),
        cwd.display().to_string(),
        "--user".into(),
        format!("{}:{}", user.0, user.1),
    ]);
    for name in env_names {
        a.extend(["--env".into(), (*name).to_string()]);
    }
    a.push(container.to_string());
    a.extend(argv.iter().cloned());
    engine.command(a)
}

/// Reads a stream to its end, keeping at most `cap` bytes and counting all.
fn drain(mut from: impl Read, cap: usize) -> (Vec<u8>, u64) {
    let mut kept = Capture::new(cap);
    let mut total = 0u64;
    let mut buf = [0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => return (kept.kept, total),
            Ok(n) => {
                total += n as u64;
                kept.push(&buf[..n]);
            }
        }
    }
}

impl DockerExecSandbox {
    /// The container's name.
    pub fn container(&self) -> &str {
        &self.name
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    /// Kills everything in the container by restarting it (its keeper
    /// comes back; the workspace is on the host and stays).
    fn restart(&self) {
        let argv = self
            .engine
            .command(["restart", "--time", "0", self.name.as_str()]);
        match self.runner.output(&argv) {
            Ok(out) if out.success => {}
            Ok(out) => tracing::warn!("docker: restarting {}: {}", self.name, out.message()),
            Err(e) => tracing::warn!("docker: restarting {}: {e}", self.name),
        }
    }
}

impl Sandbox for DockerExecSandbox {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn exec(&self, command: &Command) -> Result<Output> {
        self.check_open()?;
        let argv = hako_driver::connection::validate(command)?;
        let cwd_given = command.cwd.as_deref().unwrap_or(Path::new("."));
        // Opened through the fence: a cwd outside the workspace is refused
        // with the fence's reason.
        drop(self.fence.open_dir(cwd_given)?);
        let cwd = self.workspace.join(self.fence.relative(cwd_given)?);
        let env = hako_core::env::merge(&self.base_env, &command.env);
        let names: Vec<&str> = env.iter().map(|(k, _)| k.as_str()).collect();
        let docker_argv = exec_argv(&self.engine, &self.name, &cwd, self.user, &names, &argv);
        let start = Instant::now();
        let mut child = self
            .runner
            .spawn_with_env(&docker_argv, &env)
            .map_err(|e| backend_err("run command", format!("cannot run docker exec: {e}")))?;
        let cap = command.max_output.unwrap_or(self.max_output);
        let stdin = child.stdin.take();
        // With no input the command reads end of file at once.
        let feeder = match command.stdin.clone() {
            Some(data) => Some(std::thread::spawn(move || {
                if let Some(mut stdin) = stdin {
                    let _ = stdin.write_all(&data);
                }
            })),
            None => {
                drop(stdin);
                None
            }
        };
        let out_reader = child
            .stdout
            .take()
            .map(|s| std::thread::spawn(move || drain(s, cap)));
        let err_reader = child
            .stderr
            .take()
            .map(|s| std::thread::spawn(move || drain(s, cap)));
        let deadline = command.timeout.map(|t| start + t);
        let mut timed_out = false;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) => {}
                Err(e) => return Err(backend_err("run command", e.to_string())),
            }
            if deadline.is_some_and(|d| Instant::now() >= d) && !timed_out {
                timed_out = true;
                self.restart();
                let killed_at = Instant::now();
                // The client ends with its process; if not, kill it.
                while child.try_wait().ok().flatten().is_none() {
                    if killed_at.elapsed() > EXEC_GRACE {
                        let _ = child.kill();
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                break None;
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let _ = child.wait();
        if let Some(feeder) = feeder {
            let _ = feeder.join();
        }
        let (stdout, stdout_total) = out_reader.and_then(|r| r.join().ok()).unwrap_or_default();
        let (stderr, stderr_total) = err_reader.and_then(|r| r.join().ok()).unwrap_or_default();
        let code = status.and_then(|s| s.code());
        let program = argv.first().cloned().unwrap_or_default();
        // `docker exec` reports a program it could not start with 126 or
        // 127 and the runtime's message (on stdout or stderr, by version).
        let said = [&stdout, &stderr]
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .join("\n");
        let unstartable = !timed_out
            && matches!(code, Some(126 | 127))
            && said.contains("OCI runtime exec failed");
        if unstartable && said.contains("executable file not found") {
            return Err(Error::CommandNotFound { program });
        }
        if unstartable && said.contains("permission denied") {
            return Err(Error::CannotExecute {
                program,
                source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
            });
        }
        let status = if timed_out {
            ExitStatus::Signal(9)
        } else {
            match code {
                Some(code) => ExitStatus::Code(code),
                None => return Err(backend_err("run command", "docker exec was killed")),
            }
        };
        Ok(Output {
            status,
            stdout_truncated: stdout_total > stdout.len() as u64,
            stderr_truncated: stderr_total > stderr.len() as u64,
            stdout,
            stderr,
            stdout_total,
            stderr_total,
            duration: start.elapsed(),
            timed_out,
            // `docker exec` says only the exit code: a memory kill is
            // told only through the guest (the default exec mode).
            oom_killed: false,
        })
    }

    fn read_file(&self, path: &Path) -> Result<Vec<u8>> {
        self.check_open()?;
        Ok(self.fence.read_all(path)?)
    }

    fn write_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        self.check_open()?;
        Ok(self.fence.write(path, data)?)
    }

    fn remove(&self, path: &Path) -> Result<()> {
        self.check_open()?;
        Ok(self.fence.remove(path)?)
    }

    fn list_dir(&self, path: &Path) -> Result<DirListing> {
        self.check_open()?;
        Ok(self.fence.list(path)?)
    }

    fn replace_unchanged(&self) -> Option<&dyn hako_core::ReplaceUnchanged> {
        Some(self)
    }

    fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let argv = self.engine.command(["rm", "--force", self.name.as_str()]);
        let result = match self.runner.output(&argv) {
            Ok(out) if out.success => Ok(()),
            Ok(out) => Err(backend_err("remove the container", out.message())),
            Err(e) => Err(backend_err("remove the container", e.to_string())),
        };
        if let Ok(mut keep) = self.keep.lock() {
            keep.take();
        }
        result
    }
}

impl Drop for DockerExecSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl hako_core::ReplaceUnchanged for DockerExecSandbox {
    fn replace_unchanged(&self, path: &Path, data: &[u8], read: &[u8]) -> Result<()> {
        self.check_open()?;
        Ok(self.fence.write_if_unchanged(path, data, read)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_container::engine::EngineKind;

    #[test]
    fn docker_exec_argv_passes_variables_by_name_only() {
        let engine = Engine {
            argv: vec!["docker".into()],
            kind: EngineKind::Docker,
        };
        let argv = exec_argv(
            &engine,
            "hako-1",
            Path::new("/w/sub"),
            (1000, 100),
            &["PATH", "TOKEN"],
            &["sh".into(), "-c".into(), "echo hi".into()],
        );
        assert_eq!(
            argv,
            [
                "docker",
                "exec",
                "--interactive",
                "--workdir",
                "/w/sub",
                "--user",
                "1000:100",
                "--env",
                "PATH",
                "--env",
                "TOKEN",
                "hako-1",
                "sh",
                "-c",
                "echo hi"
            ]
        );
    }
}
