//! The closed set of backends and how each is opened.

use std::path::PathBuf;

use clap::ValueEnum;
use hako_core::env::EnvPolicy;
use hako_core::{Error, Isolation, NetworkPolicy, Sandbox};
use hako_linux::Limits;

/// A backend name on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    /// The strongest backend that works on this host.
    Auto,
    /// Host processes and the file fence; trusted code only.
    Host,
    /// Linux namespaces, Landlock, seccomp; rootless.
    Linux,
    /// A locked-down Docker or Podman container (`--runtime runsc` for gVisor).
    Docker,
    /// gVisor's runsc, driven directly; no daemon.
    Gvisor,
}

/// The backends hako knows, whether or not this build or host can run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Host processes.
    Host,
    /// Linux namespaces, Landlock, seccomp.
    Linux,
    /// A Docker or Podman container.
    Docker,
    /// gVisor's runsc.
    Gvisor,
    /// A KVM microVM.
    Vm,
}

impl BackendKind {
    /// Every backend, strongest first.
    pub const ALL: [BackendKind; 5] = [
        BackendKind::Vm,
        BackendKind::Gvisor,
        BackendKind::Docker,
        BackendKind::Linux,
        BackendKind::Host,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Linux => "linux",
            BackendKind::Docker => "docker",
            BackendKind::Gvisor => "gvisor",
            BackendKind::Vm => "vm",
        }
    }

    /// The isolation the backend provides when it works.
    pub fn isolation(self) -> Isolation {
        match self {
            BackendKind::Host => Isolation::None,
            BackendKind::Linux | BackendKind::Docker => Isolation::Process,
            BackendKind::Gvisor => Isolation::Kernel,
            BackendKind::Vm => Isolation::Vm,
        }
    }

    /// The policy gate, before anything starts: refuses a backend whose
    /// isolation is weaker than `required`.
    pub fn require_isolation(self, required: Isolation) -> Result<(), Error> {
        if self.isolation() < required {
            return Err(Error::IsolationTooWeak {
                required,
                actual: self.isolation(),
                backend: self.name().into(),
            });
        }
        Ok(())
    }
}

/// Why a backend cannot be used here, and what to do about it.
#[derive(Debug, Clone)]
pub struct Unavailable {
    pub reason: String,
    pub hint: String,
}

/// Whether a backend can be opened on this host, without opening one.
pub fn probe(kind: BackendKind) -> Result<(), Unavailable> {
    match kind {
        // The CLI runs the guest's code in a fork of itself (see
        // `hako_guest::client::Connection::start`): no helper binary needed.
        BackendKind::Host => Ok(()),
        BackendKind::Linux => {
            hako_sys::ns::user_namespaces_allowed().map_err(|reason| Unavailable {
                reason: format!("user namespaces are not available: {reason}"),
                hint: "enable unprivileged user namespaces, or use --backend docker".into(),
            })
        }
        BackendKind::Docker => hako_container::docker::ready(
            &format!("{}:latest", hako_container::image::DEFAULT_NAME),
            None,
        )
        .map_err(|reason| Unavailable {
            reason,
            hint: "install docker.io (and start dockerd) or podman, run `hako image build`, and set HAKO_GUEST_STATIC to a static hako-guest (scripts/build-static-guest)".into(),
        }),
        BackendKind::Gvisor => hako_container::gvisor::ready().map_err(|reason| Unavailable {
            reason,
            hint: "install runsc (Debian: apt-get install runsc) and set HAKO_GUEST_STATIC to a static hako-guest (scripts/build-static-guest)".into(),
        }),
        BackendKind::Vm => Err(Unavailable {
            reason: "the vm backend is not part of this build yet".into(),
            hint: "use --backend gvisor or linux; the microVM backend is on the roadmap (see README)".into(),
        }),
    }
}

/// Settings shared by every backend.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub workspace: PathBuf,
    pub env: EnvPolicy,
    pub max_output: usize,
    pub limits: Limits,
    pub ro: Vec<PathBuf>,
    pub rw: Vec<PathBuf>,
    pub best_effort: bool,
    /// The image: a name for `docker`, a root directory for `gvisor`.
    pub image: Option<String>,
    /// The OCI runtime of `docker` (`runsc` for gVisor).
    pub runtime: Option<String>,
    /// `docker` without the guest: each command is a `docker exec`.
    pub no_guest: bool,
    /// The network; `None` is the backend's default (`host` for the host
    /// backend, which has no other; `none` for every isolating one).
    pub network: Option<NetworkPolicy>,
}

impl SandboxSpec {
    /// Every host directory a command in this sandbox can write: its
    /// workspace and its writable binds. An audit log is never kept
    /// beneath one of them.
    pub fn writable(&self) -> Vec<PathBuf> {
        std::iter::once(self.workspace.clone())
            .chain(self.rw.iter().cloned())
            .collect()
    }

    /// Defaults for a workspace.
    pub fn new(workspace: PathBuf) -> Self {
        SandboxSpec {
            workspace,
            env: EnvPolicy::default(),
            max_output: hako_core::DEFAULT_MAX_OUTPUT,
            limits: Limits::default(),
            ro: Vec::new(),
            rw: Vec::new(),
            best_effort: false,
            image: None,
            runtime: None,
            no_guest: false,
            network: None,
        }
    }
}

/// Resolves `auto` to the strongest backend that works here.
pub fn resolve(arg: BackendArg) -> Result<BackendKind, Error> {
    match arg {
        BackendArg::Host => Ok(BackendKind::Host),
        BackendArg::Linux => Ok(BackendKind::Linux),
        BackendArg::Docker => Ok(BackendKind::Docker),
        BackendArg::Gvisor => Ok(BackendKind::Gvisor),
        BackendArg::Auto => BackendKind::ALL
            .into_iter()
            .find(|&kind| probe(kind).is_ok())
            .ok_or_else(|| Error::Backend {
                backend: "auto".into(),
                op: "pick a backend",
                message: "no backend works on this host; run `hako doctor` for reasons".into(),
            }),
    }
}

/// Opens a sandbox of `kind`.
pub fn open(kind: BackendKind, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, Error> {
    let refuse = |what: &str, which: &str| Error::Backend {
        backend: kind.name().into(),
        op: "open",
        message: format!(
            "{what} applies only to {which}; the {} backend has none",
            kind.name()
        ),
    };
    if spec.runtime.is_some() && kind != BackendKind::Docker {
        return Err(refuse("--runtime", "--backend docker"));
    }
    if spec.no_guest && kind != BackendKind::Docker {
        return Err(refuse("--no-guest", "--backend docker"));
    }
    if spec.image.is_some() && !matches!(kind, BackendKind::Docker | BackendKind::Gvisor) {
        return Err(refuse("--image", "--backend docker and gvisor"));
    }
    let network = spec.network.clone().unwrap_or_else(|| match kind {
        BackendKind::Host => NetworkPolicy::host(),
        _ => NetworkPolicy::none(),
    });
    match kind {
        BackendKind::Host => {
            // The host backend enforces no resource limit and has no view
            // to bind into: refuse rather than pretend.
            let asked = spec.limits != Limits::default();
            if (asked && !spec.best_effort) || !spec.ro.is_empty() || !spec.rw.is_empty() {
                return Err(Error::Backend {
                    backend: "host".into(),
                    op: "open",
                    message: "the host backend cannot enforce --memory, --pids, --cpus, --max-file-size, --max-open-files, --ro or --rw; use --backend linux (or --best-effort to run without the limits)".into(),
                });
            }
            let mut config = hako_host::HostConfig::new(&spec.workspace);
            config.env = spec.env.clone();
            config.max_output = spec.max_output;
            config.network = network;
            Ok(Box::new(hako_host::HostSandbox::new(config)?))
        }
        BackendKind::Linux => {
            let mut config = hako_linux::LinuxConfig::new(&spec.workspace);
            config.env = spec.env.clone();
            config.max_output = spec.max_output;
            config.limits = spec.limits;
            config.ro = spec.ro.clone();
            config.rw = spec.rw.clone();
            config.best_effort = spec.best_effort;
            config.network = network;
            Ok(Box::new(hako_linux::LinuxSandbox::new(config)?))
        }
        BackendKind::Docker => {
            let mut config = hako_container::DockerConfig::new(&spec.workspace);
            if let Some(image) = &spec.image {
                config.image = image.clone();
            }
            config.runtime = spec.runtime.clone();
            config.best_effort = spec.best_effort;
            config.env = spec.env.clone();
            config.max_output = spec.max_output;
            config.limits = spec.limits;
            config.ro = spec.ro.clone();
            config.rw = spec.rw.clone();
            config.network = network;
            if spec.no_guest {
                return Ok(Box::new(hako_container::DockerExecSandbox::new(config)?));
            }
            Ok(Box::new(hako_container::DockerSandbox::new(config)?))
        }
        BackendKind::Gvisor => {
            let mut config = hako_container::GvisorConfig::new(&spec.workspace);
            config.rootfs = spec.image.as_ref().map(PathBuf::from);
            config.env = spec.env.clone();
            config.max_output = spec.max_output;
            config.limits = spec.limits;
            config.ro = spec.ro.clone();
            config.rw = spec.rw.clone();
            config.best_effort = spec.best_effort;
            config.network = network;
            Ok(Box::new(hako_container::GvisorSandbox::new(config)?))
        }
        BackendKind::Vm => Err(Error::Backend {
            backend: "vm".into(),
            op: "open",
            message: probe(kind)
                .err()
                .map(|u| format!("{}; hint: {}", u.reason, u.hint))
                .unwrap_or_default(),
        }),
    }
}
