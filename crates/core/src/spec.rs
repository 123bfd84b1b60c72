//! The one description of a sandbox, whatever the backend.

use std::path::PathBuf;

use crate::env::EnvPolicy;
use crate::{Isolation, Limits, NetworkPolicy};

/// Shell sessions open at once in one sandbox unless `--max-sessions`
/// says otherwise.
pub const DEFAULT_MAX_SESSIONS: usize = 16;

/// Long-lived processes running at once in one sandbox unless
/// `--max-processes` says otherwise.
pub const DEFAULT_MAX_PROCESSES: usize = 32;

/// A copy-on-write workspace (`--cow`): the sandbox sees the workspace
/// through overlayfs, the workspace the read-only lower layer and every
/// change landing in `upper`; the real workspace is never written. Both
/// directories are on one file system, outside the workspace and every
/// bind (`hako_layers::state` makes them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CowLayers {
    /// The upper layer: every change the sandbox makes.
    pub upper: PathBuf,
    /// overlayfs's work directory, beside it.
    pub work: PathBuf,
}

/// What a sandbox is to be, independent of the backend that builds it.
///
/// Every front end fills in this one type (`hako-runtime` parses it from
/// flags and a profile) and every backend is opened from it: a backend's
/// own configuration is this spec and how this process launches it,
/// never a copy of its fields. A setting the chosen backend cannot honour is refused
/// when the sandbox is opened, never dropped silently, unless
/// [`best_effort`](SandboxSpec::best_effort) says to run without it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxSpec {
    /// The host directory the sandbox works in, read-write; it appears at
    /// the same path inside.
    pub workspace: PathBuf,
    /// Which host variables pass into the sandbox, and what is set there.
    pub env: EnvPolicy,
    /// Bytes kept of each of a command's stdout and stderr.
    pub max_output: usize,
    /// Resource limits; the `host` backend enforces none and refuses them
    /// unless [`best_effort`](SandboxSpec::best_effort).
    pub limits: Limits,
    /// Extra host directories bound read-only, at the same path inside
    /// (`linux`, `docker`, `gvisor`).
    pub ro: Vec<PathBuf>,
    /// Extra host directories bound read-write, at the same path inside
    /// (`linux`, `docker`, `gvisor`).
    pub rw: Vec<PathBuf>,
    /// Run even when a requested protection or limit cannot be enforced
    /// here; the sandbox's capabilities then say what is missing.
    pub best_effort: bool,
    /// The image: a name for `docker`, a root directory for `gvisor`;
    /// `None` is the backend's default.
    pub image: Option<String>,
    /// The OCI runtime of `docker` (`runsc` for gVisor); `None` is the
    /// engine's default.
    pub runtime: Option<String>,
    /// `docker` without the guest: each command is a `docker exec`.
    pub no_guest: bool,
    /// The network; `None` is the backend's default (`host` for the host
    /// backend, which has no other; `none` for every isolating one).
    pub network: Option<NetworkPolicy>,
    /// The weakest isolation a sandbox may have (`--min-isolation`); a
    /// front end refuses, before anything runs, a backend weaker than
    /// this (`hako_runtime::Opener` does it for the servers).
    pub min_isolation: Isolation,
    /// Accept an emulated VM (QEMU's TCG, which QEMU's security policy does
    /// not count as a boundary) as isolation `vm` (`--allow-emulated-vm`);
    /// without it the `vm` backend refuses to stand for `--min-isolation
    /// vm` where it can only emulate.
    pub allow_emulated_vm: bool,
    /// Shell sessions open at once in one sandbox (`--max-sessions`); one
    /// more is refused with [`Error::LimitReached`](crate::Error::LimitReached).
    pub max_sessions: usize,
    /// Long-lived processes running at once in one sandbox
    /// (`--max-processes`); one more is refused the same way.
    pub max_processes: usize,
    /// A copy-on-write workspace (`--cow`; `linux`, `docker`, `gvisor`); `None`
    /// binds the workspace read-write. A backend that cannot give one
    /// refuses it with [`Error::Unsupported`](crate::Error::Unsupported).
    pub cow: Option<CowLayers>,
}

impl SandboxSpec {
    /// Defaults for a workspace: no limits, no extra binds, the default
    /// output cap, environment and network, every protection required.
    pub fn new(workspace: PathBuf) -> Self {
        SandboxSpec {
            workspace,
            env: EnvPolicy::default(),
            max_output: crate::DEFAULT_MAX_OUTPUT,
            limits: Limits::default(),
            ro: Vec::new(),
            rw: Vec::new(),
            best_effort: false,
            image: None,
            runtime: None,
            no_guest: false,
            network: None,
            min_isolation: Isolation::None,
            allow_emulated_vm: false,
            max_sessions: crate::DEFAULT_MAX_SESSIONS,
            max_processes: crate::DEFAULT_MAX_PROCESSES,
            cow: None,
        }
    }

    /// Refuses a copy-on-write workspace, for a backend that cannot give
    /// one: nothing is started, and the real workspace is never written
    /// in its place (fail closed).
    pub fn refuse_cow(&self, backend: &str) -> crate::Result<()> {
        match self.cow {
            Some(_) => Err(crate::Error::Unsupported {
                backend: backend.into(),
                capability:
                    "--cow (a copy-on-write workspace; use --backend linux, docker, gvisor or vm)",
            }),
            None => Ok(()),
        }
    }

    /// Every host directory a command in this sandbox can write: its
    /// workspace and its writable binds. An audit log is never kept
    /// beneath one of them.
    pub fn writable(&self) -> Vec<PathBuf> {
        std::iter::once(self.workspace.clone())
            .chain(self.rw.iter().cloned())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writable_is_the_workspace_then_the_read_write_binds_and_never_a_read_only_one() {
        let mut spec = SandboxSpec::new("/ws".into());
        assert_eq!(spec.writable(), [PathBuf::from("/ws")]);
        spec.ro = vec!["/usr/share".into()];
        spec.rw = vec!["/cache".into(), "/out".into()];
        assert_eq!(
            spec.writable(),
            [
                PathBuf::from("/ws"),
                PathBuf::from("/cache"),
                PathBuf::from("/out")
            ]
        );
    }

    #[test]
    fn a_new_spec_asks_for_nothing_beyond_the_defaults() {
        let spec = SandboxSpec::new("/ws".into());
        assert_eq!(spec.limits, Limits::default());
        assert_eq!(spec.max_output, crate::DEFAULT_MAX_OUTPUT);
        assert_eq!(spec.env, EnvPolicy::default());
        assert!(!spec.best_effort && !spec.no_guest);
        assert!(spec.image.is_none() && spec.runtime.is_none() && spec.network.is_none());
        assert!(spec.ro.is_empty() && spec.rw.is_empty());
    }
}
