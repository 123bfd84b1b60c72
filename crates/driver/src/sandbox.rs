//! A sandbox whose commands run under `hako-guest`: the part every backend
//! shares. A backend opens the fence, says what it enforces, and supplies a
//! [`Launcher`]; everything else (exec, sessions, long-lived processes,
//! terminals, output caps, the idle lease, closing, file operations through
//! the fence) is here, written once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hako_core::{
    AppendFile, Capabilities, Command, DirListing, Error, ExecStream, MakeDirAll, Metadata,
    NetworkEvents, Output, OutputSink, OutputSlice, ProcessId, ProcessState, Processes, Program,
    ReadLimit, ReadOutcome, Result, Sandbox, SessionId, SessionOptions, Sessions, SpawnOptions,
    StatPath, Stream, TermSize, Workdir,
};
use hako_fence::Fence;

use crate::connection as driver;
pub use crate::connection::LocalPlan;
use crate::proto::{MemoryWatch, NetSpec, Seal};
pub use crate::recipe::{
    base_env, base_env_defaulting, common_limits, open_workspace, resource_limit_reports, OPTIONAL,
};
use crate::{DriverOptions, InProcessGuest};

/// How a backend's guest comes to life.
pub enum GuestStart {
    /// hako starts the guest itself, sharing its view of the system.
    Local {
        /// What the guest builds or applies before it serves: a `linux`
        /// sandbox around itself, or its commands' confinement.
        plan: Box<LocalPlan>,
        /// The guest's code, where this program links it: a
        /// single-threaded caller then starts the guest in a fork of
        /// itself rather than executing `hako-guest`.
        in_process: Option<InProcessGuest>,
    },
    /// A process already started (a container runtime's client) whose
    /// stdin and stdout reach the guest; `describe` says what became of
    /// it once the link is lost (for the error every waiting call gets).
    Piped {
        /// The process.
        child: std::process::Child,
        /// What became of the sandbox, asked once its guest is gone.
        describe: Box<dyn Fn() -> String + Send + Sync>,
        /// The sandbox's end of the egress proxy, for the guest to set up.
        network: Option<NetSpec>,
        /// What the guest does to itself before it serves (see
        /// [`Seal`]).
        seal: Option<Seal>,
        /// How the guest tells that the memory limit killed a command
        /// (see [`MemoryWatch`]).
        memory: Option<MemoryWatch>,
    },
}

/// What distinguishes one backend from another once the guest does the
/// work: how the guest starts (and what it builds before it serves
/// commands), and where a command's working directory is inside.
pub trait Launcher: Send + Sync + std::fmt::Debug {
    /// Starts the guest (once, when the sandbox opens).
    fn start(&self) -> Result<GuestStart>;

    /// The absolute path inside the sandbox of the workspace directory
    /// `rel` (checked by the fence); `None` passes the directory itself to
    /// the guest as a descriptor (only where the guest shares hako's view).
    fn cwd_inside(&self, rel: &Path) -> Option<PathBuf>;

    /// Tears down what the launcher holds (called by `close`, once or
    /// more). `guest_exited_cleanly`: the guest's process (for a container,
    /// the runtime's client) was seen to exit with status 0, so nothing of
    /// the sandbox is left for the launcher to remove.
    fn close(&self, guest_exited_cleanly: bool) {
        let _ = guest_exited_cleanly;
    }

    /// Whether [`close`](Self::close) tears down something that every
    /// process of the sandbox must have left first (a cgroup): then the
    /// guest's end is always waited for, even when hako exits next (see
    /// [`ExitFollowsClose`](crate::ExitFollowsClose)).
    fn waits_for_guest(&self) -> bool {
        false
    }

    /// Whether what the runtime's client leaves behind is removed by a
    /// process of its own once the client exits (gVisor's bundle, by the
    /// gVisor backend's cleaner): then a process that exits next
    /// need not wait for the client (see
    /// [`ExitFollowsClose`](crate::ExitFollowsClose)), and calls
    /// [`abandon`](Self::abandon) instead of [`close`](Self::close).
    fn cleans_up_after_itself(&self) -> bool {
        false
    }

    /// In place of [`close`](Self::close) when the client was not waited
    /// for (see [`cleans_up_after_itself`](Self::cleans_up_after_itself)):
    /// leaves what the cleaner removes where it is.
    fn abandon(&self) {}
}

/// Everything a backend decides when it opens a [`GuestSandbox`].
#[derive(Debug)]
pub struct GuestConfig {
    /// The backend's name.
    pub backend: &'static str,
    /// The workspace fence.
    pub fence: Fence,
    /// What the sandbox enforces.
    pub caps: Capabilities,
    /// The environment every command starts from.
    pub base_env: Vec<(String, String)>,
    /// The `hako-guest` binary; `None` chooses (see
    /// [`Connection::start`](crate::connection::Connection::start)).
    pub guest: Option<PathBuf>,
    /// Default cap on each output stream.
    pub max_output: usize,
    /// What the guest builds, and where commands start.
    pub launcher: Box<dyn Launcher>,
    /// The idle lease: the sandbox closes itself after this long with no
    /// call in progress and no long-lived process running.
    pub idle_timeout: Option<Duration>,
    /// The egress proxy (network mode `allow`), stopped when the sandbox
    /// closes.
    pub proxy: Option<hako_net::Proxy>,
    /// How the caller has the driver read and close the sandbox.
    pub driver: DriverOptions,
}

/// What closing needs, shared with the idle-lease watchdog.
#[derive(Debug)]
struct Life {
    guest: driver::Connection,
    launcher: Box<dyn Launcher>,
    proxy: Option<hako_net::Proxy>,
    driver: DriverOptions,
    closed: AtomicBool,
    /// Calls in progress.
    busy: AtomicUsize,
    /// When the last call started or ended.
    last: Mutex<Instant>,
}

impl Life {
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        // With nothing to tear down after the guest (no cgroup, no proxy
        // whose records must be complete) and this process exiting next,
        // the guest's own end is not waited for.
        let exit_follows = self.driver.exit_follows_close.is_set()
            && self.proxy.is_none()
            && !self.launcher.waits_for_guest();
        let self_cleaning = self.launcher.cleans_up_after_itself();
        let left = exit_follows && self.guest.close_before_exit(self_cleaning);
        if !exit_follows {
            self.guest.close();
        }
        if left && self_cleaning {
            self.launcher.abandon();
        } else {
            self.launcher.close(self.guest.exited_cleanly());
        }
        // After the guest: every connection from inside has ended, and its
        // record is kept.
        if let Some(proxy) = &self.proxy {
            proxy.shutdown();
        }
    }

    fn touch(&self) {
        if let Ok(mut last) = self.last.lock() {
            *last = Instant::now();
        }
    }

    fn idle_for(&self) -> Duration {
        if self.busy.load(Ordering::Acquire) > 0 || self.guest.any_process_running() {
            return Duration::ZERO;
        }
        self.last.lock().map(|l| l.elapsed()).unwrap_or_default()
    }
}

/// One call in progress (activity for the idle lease).
struct Busy<'a>(&'a Life);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A sandbox whose commands run under `hako-guest` and whose file
/// operations go through the fence: every backend is one of these plus a
/// [`Launcher`].
#[derive(Debug)]
pub struct GuestSandbox {
    life: Arc<Life>,
    fence: Fence,
    caps: Capabilities,
    base_env: Vec<(String, String)>,
    max_output: usize,
}

/// Watches the idle lease: closes the sandbox once it has been idle for
/// `lease`; ends when the sandbox closes or is dropped.
fn watch_lease(life: Weak<Life>, lease: Duration) {
    let tick = (lease / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    loop {
        std::thread::sleep(tick);
        let Some(life) = life.upgrade() else { return };
        if life.closed.load(Ordering::Acquire) {
            return;
        }
        if life.idle_for() >= lease {
            tracing::info!("closing a sandbox idle for {lease:?}");
            life.close();
            return;
        }
    }
}

impl GuestSandbox {
    /// Starts the sandbox's guest (which builds what the launcher asks
    /// for): a host that cannot build it fails here, with the reason.
    pub fn new(config: GuestConfig) -> Result<Self> {
        let root = config.fence.open_dir(Path::new("."))?;
        let guest = config.launcher.start().and_then(|start| match start {
            GuestStart::Local { plan, in_process } => driver::Connection::start(
                config.backend,
                config.guest.as_deref(),
                root,
                *plan,
                in_process.as_ref(),
                config.driver.read_on_caller,
            ),
            GuestStart::Piped {
                child,
                describe,
                network,
                seal,
                memory,
            } => driver::Connection::over_pipes(
                config.backend,
                child,
                describe,
                network,
                seal,
                memory,
            ),
        });
        let guest = match guest {
            Ok(guest) => guest,
            Err(err) => {
                config.launcher.close(false);
                if let Some(proxy) = &config.proxy {
                    proxy.shutdown();
                }
                return Err(err);
            }
        };
        if let Some(proxy) = &config.proxy {
            // The guest is up (forked, where it was, from a process that
            // had one thread): the proxy may have its threads now.
            if let Err(source) = proxy.serve() {
                guest.close();
                config.launcher.close(guest.exited_cleanly());
                proxy.shutdown();
                return Err(Error::Io {
                    op: "start the egress proxy",
                    source,
                });
            }
        }
        let life = Arc::new(Life {
            guest,
            launcher: config.launcher,
            proxy: config.proxy,
            driver: config.driver,
            closed: AtomicBool::new(false),
            busy: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        });
        if let Some(lease) = config.idle_timeout {
            let weak = Arc::downgrade(&life);
            std::thread::Builder::new()
                .name("hako-idle-lease".into())
                .spawn(move || watch_lease(weak, lease))
                .map_err(|source| Error::Io {
                    op: "start the idle-lease watchdog",
                    source,
                })?;
        }
        Ok(GuestSandbox {
            life,
            fence: config.fence,
            caps: config.caps,
            base_env: config.base_env,
            max_output: config.max_output,
        })
    }

    /// The pid of the guest's process, as [`Connection::guest_pid`](driver::Connection::guest_pid) says.
    pub fn guest_pid(&self) -> Option<i32> {
        self.life.guest.guest_pid()
    }

    /// Puts the file operations (and the working directories of
    /// commands) on `fence` from now on: for a sandbox whose commands see
    /// another tree than the one the backend opened (a copy-on-write
    /// sandbox's layered view).
    pub fn set_fence(&mut self, fence: Fence) {
        self.fence = fence;
    }

    /// The workspace fence.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// The base environment every command starts from.
    pub fn base_env(&self) -> &[(String, String)] {
        &self.base_env
    }

    /// Checks the sandbox is open and counts the call as activity until
    /// the returned guard drops.
    fn check_open(&self) -> Result<Busy<'_>> {
        self.life.busy.fetch_add(1, Ordering::AcqRel);
        self.life.touch();
        let busy = Busy(&self.life);
        if self.life.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        Ok(busy)
    }

    /// The working directory of a command or session: opened through the
    /// fence, then given as a path inside or as the descriptor.
    fn exec_cwd(&self, cwd: Option<&Path>) -> Result<driver::ExecCwd> {
        let cwd_given = cwd.unwrap_or(Path::new("."));
        // Opened through the fence either way: a working directory outside
        // the workspace is refused here, with the fence's reason.
        let cwd_fd = self.fence.open_dir(cwd_given)?;
        Ok(
            match self
                .life
                .launcher
                .cwd_inside(&self.fence.relative(cwd_given)?)
            {
                Some(path) => driver::ExecCwd::Path(path),
                None => driver::ExecCwd::Fd(cwd_fd),
            },
        )
    }

    fn run(&self, command: &Command, sink: Option<&mut OutputSink<'_>>) -> Result<Output> {
        let _busy = self.check_open()?;
        let argv = driver::validate(command)?;
        let cwd = self.exec_cwd(command.cwd.as_deref())?;
        let env = hako_core::env::merge(&self.base_env, &command.env);
        self.life.guest.exec(
            driver::Exec {
                argv,
                env,
                cwd,
                command,
                max_output: command.max_output.unwrap_or(self.max_output),
            },
            sink,
        )
    }
}

impl Sandbox for GuestSandbox {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn exec(&self, command: &Command) -> Result<Output> {
        self.run(command, None)
    }

    fn read_file(&self, path: &Path) -> Result<Vec<u8>> {
        let _busy = self.check_open()?;
        Ok(self.fence.read_all(path)?)
    }

    fn write_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        let _busy = self.check_open()?;
        Ok(self.fence.write(path, data)?)
    }

    fn remove(&self, path: &Path) -> Result<()> {
        let _busy = self.check_open()?;
        Ok(self.fence.remove(path)?)
    }

    fn list_dir(&self, path: &Path) -> Result<DirListing> {
        let _busy = self.check_open()?;
        Ok(self.fence.list(path)?)
    }

    fn close(&self) -> Result<()> {
        self.life.close();
        Ok(())
    }

    fn replace_unchanged(&self) -> Option<&dyn hako_core::ReplaceUnchanged> {
        Some(self)
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

    fn sessions(&self) -> Option<&dyn Sessions> {
        Some(self)
    }

    fn processes(&self) -> Option<&dyn Processes> {
        Some(self)
    }

    fn network_events(&self) -> Option<&dyn NetworkEvents> {
        self.life.proxy.as_ref().map(|_| self as &dyn NetworkEvents)
    }
}

impl NetworkEvents for GuestSandbox {
    fn take_network_events(&self) -> (Vec<hako_core::NetEvent>, u64) {
        match &self.life.proxy {
            Some(proxy) => proxy.take_events(),
            None => (Vec::new(), 0),
        }
    }
}

impl ReadLimit for GuestSandbox {
    fn read_file_limit(&self, path: &Path, max: u64) -> Result<ReadOutcome> {
        let _busy = self.check_open()?;
        Ok(self.fence.read(path, max)?)
    }
}

impl AppendFile for GuestSandbox {
    fn append_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        let _busy = self.check_open()?;
        Ok(self.fence.append(path, data)?)
    }
}

impl MakeDirAll for GuestSandbox {
    fn make_dir_all(&self, path: &Path) -> Result<()> {
        let _busy = self.check_open()?;
        Ok(self.fence.make_dir_all(path)?)
    }
}

impl Workdir for GuestSandbox {
    fn workdir(&self) -> &Path {
        self.fence.workdir()
    }
}

impl StatPath for GuestSandbox {
    fn stat(&self, path: &Path) -> Result<Metadata> {
        let _busy = self.check_open()?;
        Ok(self.fence.stat(path)?)
    }
}

impl ExecStream for GuestSandbox {
    fn exec_stream(&self, command: &Command, sink: &mut OutputSink<'_>) -> Result<Output> {
        self.run(command, Some(sink))
    }
}

impl Sessions for GuestSandbox {
    fn open_session(&self, options: &SessionOptions) -> Result<SessionId> {
        let _busy = self.check_open()?;
        let cwd = self.exec_cwd(options.cwd.as_deref())?;
        for (k, v) in &options.env {
            if !hako_core::env::valid_name(k) || v.contains('\0') {
                return Err(Error::InvalidCommand {
                    reason: format!("environment variable {k:?} is not valid"),
                });
            }
        }
        let env = hako_core::env::merge(&self.base_env, &options.env);
        self.life.guest.open_session(env, cwd).map(SessionId)
    }

    fn session_exec(
        &self,
        session: SessionId,
        command: &Command,
        sink: Option<&mut OutputSink<'_>>,
    ) -> Result<Output> {
        let _busy = self.check_open()?;
        let unset = |what: &str| {
            Error::InvalidCommand {
            reason: format!("a session command cannot set its own {what}; use the session's shell (cd, export, redirection) instead"),
        }
        };
        if command.cwd.is_some() {
            return Err(unset("working directory"));
        }
        if !command.env.is_empty() {
            return Err(unset("environment"));
        }
        if command.stdin.is_some() {
            return Err(unset("stdin"));
        }
        let script = match &command.program {
            Program::Shell(script) => script.clone(),
            Program::Argv(argv) => {
                driver::validate(command)?;
                argv.iter()
                    .map(|a| shell_quote(a))
                    .collect::<Vec<_>>()
                    .join(" ")
            }
        };
        if script.contains('\0') {
            return Err(Error::InvalidCommand {
                reason: "the script contains a NUL byte".into(),
            });
        }
        self.life.guest.session_exec(
            session.0,
            script,
            command,
            command.max_output.unwrap_or(self.max_output),
            sink,
        )
    }

    fn close_session(&self, session: SessionId) -> Result<()> {
        let _busy = self.check_open()?;
        self.life.guest.close_session(session.0)
    }
}

impl Processes for GuestSandbox {
    fn spawn(&self, command: &Command, options: &SpawnOptions) -> Result<ProcessId> {
        let _busy = self.check_open()?;
        let argv = driver::validate(command)?;
        let cwd = self.exec_cwd(command.cwd.as_deref())?;
        let env = hako_core::env::merge(&self.base_env, &command.env);
        self.life
            .guest
            .spawn(
                driver::Exec {
                    argv,
                    env,
                    cwd,
                    command,
                    max_output: 0,
                },
                options,
            )
            .map(ProcessId)
    }

    fn read_output(
        &self,
        id: ProcessId,
        stream: Stream,
        offset: u64,
        max: usize,
        wait: Option<Duration>,
    ) -> Result<OutputSlice> {
        let _busy = self.check_open()?;
        self.life.guest.read_output(id.0, stream, offset, max, wait)
    }

    fn write_stdin(&self, id: ProcessId, data: &[u8]) -> Result<()> {
        let _busy = self.check_open()?;
        self.life.guest.write_stdin(id.0, data)
    }

    fn close_stdin(&self, id: ProcessId) -> Result<()> {
        let _busy = self.check_open()?;
        self.life.guest.close_stdin(id.0)
    }

    fn resize(&self, id: ProcessId, size: TermSize) -> Result<()> {
        let _busy = self.check_open()?;
        self.life.guest.resize(id.0, size)
    }

    fn wait(&self, id: ProcessId, wait: Option<Duration>) -> Result<ProcessState> {
        let _busy = self.check_open()?;
        self.life.guest.wait(id.0, wait)
    }

    fn kill(&self, id: ProcessId) -> Result<()> {
        let _busy = self.check_open()?;
        self.life.guest.kill(id.0)
    }

    fn list(&self) -> Result<Vec<ProcessState>> {
        let _busy = self.check_open()?;
        self.life.guest.list()
    }
}

/// `arg` as one shell word.
fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', "'\\''"))
    }
}

impl Drop for GuestSandbox {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

/// Implements [`Sandbox`](hako_core::Sandbox) for a backend type that wraps
/// a [`GuestSandbox`] in field `$field`, by delegation.
#[macro_export]
macro_rules! delegate_sandbox {
    ($ty:ty, $field:ident) => {
        impl hako_core::Sandbox for $ty {
            fn capabilities(&self) -> &hako_core::Capabilities {
                self.$field.capabilities()
            }
            fn exec(&self, command: &hako_core::Command) -> hako_core::Result<hako_core::Output> {
                self.$field.exec(command)
            }
            fn read_file(&self, path: &std::path::Path) -> hako_core::Result<Vec<u8>> {
                self.$field.read_file(path)
            }
            fn write_file(&self, path: &std::path::Path, data: &[u8]) -> hako_core::Result<()> {
                self.$field.write_file(path, data)
            }
            fn remove(&self, path: &std::path::Path) -> hako_core::Result<()> {
                self.$field.remove(path)
            }
            fn list_dir(&self, path: &std::path::Path) -> hako_core::Result<hako_core::DirListing> {
                self.$field.list_dir(path)
            }
            fn close(&self) -> hako_core::Result<()> {
                self.$field.close()
            }
            fn read_limit(&self) -> Option<&dyn hako_core::ReadLimit> {
                self.$field.read_limit()
            }
            fn append(&self) -> Option<&dyn hako_core::AppendFile> {
                self.$field.append()
            }
            fn replace_unchanged(&self) -> Option<&dyn hako_core::ReplaceUnchanged> {
                self.$field.replace_unchanged()
            }
            fn make_dir_all(&self) -> Option<&dyn hako_core::MakeDirAll> {
                self.$field.make_dir_all()
            }
            fn workdir(&self) -> Option<&dyn hako_core::Workdir> {
                self.$field.workdir()
            }
            fn stat(&self) -> Option<&dyn hako_core::StatPath> {
                self.$field.stat()
            }
            fn exec_stream(&self) -> Option<&dyn hako_core::ExecStream> {
                self.$field.exec_stream()
            }
            fn sessions(&self) -> Option<&dyn hako_core::Sessions> {
                self.$field.sessions()
            }
            fn processes(&self) -> Option<&dyn hako_core::Processes> {
                self.$field.processes()
            }
            fn network_events(&self) -> Option<&dyn hako_core::NetworkEvents> {
                self.$field.network_events()
            }
        }
    };
}

impl hako_core::ReplaceUnchanged for GuestSandbox {
    fn replace_unchanged(&self, path: &Path, data: &[u8], read: &[u8]) -> Result<()> {
        let _busy = self.check_open()?;
        Ok(self.fence.write_if_unchanged(path, data, read)?)
    }
}
