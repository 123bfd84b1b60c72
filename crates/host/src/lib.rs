//! The `host` backend: Isolation `None`, for trusted code only.
//!
//! Each command runs as a child process on the host, under `hako-guest`,
//! which puts the command in a session of its own, becomes the subreaper of
//! everything it starts, enforces the deadline and, when the command ends,
//! kills and reaps every process it left behind. The environment is built
//! from a minimal base plus an allowlist, and only stdio reaches the command.
//! File operations go through the fence.
//!
//! What this backend does not do: it does not stop a command from reading,
//! writing or connecting to anything the invoking user can. The fence
//! confines hako's own file operations, not the command's.

mod driver;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use hako_core::env::EnvPolicy;
use hako_core::{
    AppendFile, Capabilities, Command, DirListing, Error, ExecStream, Isolation, LimitKind,
    LimitMechanism, LimitReport, MakeDirAll, Metadata, NetworkAccess, Optional, Output, OutputSink,
    ReadLimit, ReadOutcome, Result, Sandbox, StatPath, Workdir, DEFAULT_MAX_OUTPUT,
};
use hako_fence::{Fence, FenceOptions};

pub use driver::locate_guest;

/// The backend's name.
pub const NAME: &str = "host";

/// How a host sandbox is set up.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The sandbox root: commands start here and every file operation is
    /// fenced to it.
    pub workspace: PathBuf,
    /// Which host variables pass, and what is set.
    pub env: EnvPolicy,
    /// Cap on each of stdout and stderr kept per command.
    pub max_output: usize,
    /// Fence settings (resolver, read and listing limits).
    pub fence: FenceOptions,
    /// The `hako-guest` binary; `None` finds it (see [`locate_guest`]).
    pub guest: Option<PathBuf>,
}

impl HostConfig {
    /// Defaults for a workspace.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        HostConfig {
            workspace: workspace.into(),
            env: EnvPolicy::default(),
            max_output: DEFAULT_MAX_OUTPUT,
            fence: FenceOptions::default(),
            guest: None,
        }
    }
}

/// A sandbox whose commands are host processes.
#[derive(Debug)]
pub struct HostSandbox {
    fence: Fence,
    caps: Capabilities,
    base_env: Vec<(String, String)>,
    guest: PathBuf,
    max_output: usize,
    closed: AtomicBool,
    running: driver::Running,
}

impl HostSandbox {
    /// Opens the workspace and finds the guest; starts nothing yet.
    pub fn new(config: HostConfig) -> Result<Self> {
        let fence = Fence::open(&config.workspace, config.fence.clone())?;
        let guest = match config.guest {
            Some(path) => path,
            None => locate_guest()?,
        };
        let base_env = config.env.build(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        );
        let caps = Capabilities {
            backend: NAME.to_string(),
            isolation: Isolation::None,
            network: NetworkAccess::Host,
            fence: fence.resolver(),
            limits: vec![
                LimitReport {
                    kind: LimitKind::Timeout,
                    value: None,
                    mechanism: LimitMechanism::Supervisor,
                },
                LimitReport {
                    kind: LimitKind::OutputBytes,
                    value: Some(config.max_output as u64),
                    mechanism: LimitMechanism::Hako,
                },
                LimitReport {
                    kind: LimitKind::ReadBytes,
                    value: Some(fence.max_read()),
                    mechanism: LimitMechanism::Hako,
                },
                LimitReport {
                    kind: LimitKind::DirEntries,
                    value: Some(fence.max_entries() as u64),
                    mechanism: LimitMechanism::Hako,
                },
            ],
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            seccomp: false,
            optional: Optional {
                read_limit: true,
                append: true,
                make_dir_all: true,
                workdir: true,
                stat: true,
                exec_stream: true,
            },
        };
        Ok(HostSandbox {
            fence,
            caps,
            base_env,
            guest,
            max_output: config.max_output,
            closed: AtomicBool::new(false),
            running: driver::Running::default(),
        })
    }

    /// The base environment every command starts from.
    pub fn base_env(&self) -> &[(String, String)] {
        &self.base_env
    }

    fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(())
    }

    fn run(&self, command: &Command, sink: Option<&mut OutputSink<'_>>) -> Result<Output> {
        self.check_open()?;
        let argv = driver::validate(command)?;
        let cwd = self
            .fence
            .open_dir(command.cwd.as_deref().unwrap_or(Path::new(".")))?;
        let env = hako_core::env::merge(&self.base_env, &command.env);
        driver::run(
            driver::Launch {
                guest: &self.guest,
                argv,
                env,
                cwd,
                command,
                max_output: command.max_output.unwrap_or(self.max_output),
                running: &self.running,
            },
            sink,
        )
    }
}

impl Sandbox for HostSandbox {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn exec(&self, command: &Command) -> Result<Output> {
        self.run(command, None)
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

    fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        self.running.cancel_all();
        Ok(())
    }

    fn read_limit(&self) -> Option<&dyn ReadLimit> {
        Some(self)
    }

    fn append(&self) -> Option<&dyn AppendFile> {
        Some(self)
    }

    fn make_dir_all(&self) -> Option<&dyn MakeDirAll> {
        Some(self)
    }

    fn workdir(&self) -> Option<&dyn Workdir> {
        Some(self)
    }

    fn stat(&self) -> Option<&dyn StatPath> {
        Some(self)
    }

    fn exec_stream(&self) -> Option<&dyn ExecStream> {
        Some(self)
    }
}

impl ReadLimit for HostSandbox {
    fn read_file_limit(&self, path: &Path, max: u64) -> Result<ReadOutcome> {
        self.check_open()?;
        Ok(self.fence.read(path, max)?)
    }
}

impl AppendFile for HostSandbox {
    fn append_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        self.check_open()?;
        Ok(self.fence.append(path, data)?)
    }
}

impl MakeDirAll for HostSandbox {
    fn make_dir_all(&self, path: &Path) -> Result<()> {
        self.check_open()?;
        Ok(self.fence.make_dir_all(path)?)
    }
}

impl Workdir for HostSandbox {
    fn workdir(&self) -> &Path {
        self.fence.workdir()
    }
}

impl StatPath for HostSandbox {
    fn stat(&self, path: &Path) -> Result<Metadata> {
        self.check_open()?;
        Ok(self.fence.stat(path)?)
    }
}

impl ExecStream for HostSandbox {
    fn exec_stream(&self, command: &Command, sink: &mut OutputSink<'_>) -> Result<Output> {
        self.run(command, Some(sink))
    }
}

impl Drop for HostSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
