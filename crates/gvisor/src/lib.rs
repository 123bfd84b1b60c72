//! The `gvisor` backend: gVisor's `runsc` driven directly, no daemon.
//!
//! hako writes an OCI bundle (its `config.json` generated from the same
//! policy as the other backends: `noNewPrivileges`, limits, the workspace
//! as the only writable host directory) and runs `runsc run` with the
//! static guest as the container's process, reached over the client's
//! stdio. The root is a read-only view of the host's system directories or
//! an image directory. The guest starts with `CAP_SYS_ADMIN` and
//! `CAP_SETPCAP` inside gVisor and nothing else; before it reads a
//! command it masks the `/etc` secrets, drops every capability and
//! installs the seccomp policy on itself (`hako_proto::Seal`),
//! and refuses to serve if any of it fails.
//!
//! What it enforces: every system call of the sandbox is served by gVisor's
//! own kernel (the Sentry), itself confined by seccomp on the host
//! (Isolation Kernel); network none (or, with `allow`, only the egress
//! proxy's socket, the one host socket gVisor is let open). What it does not: a bug in the Sentry
//! or the host kernel calls it makes is still an escape, and file access
//! goes through a gofer that runs on the host.

//!
//! Its host view ([`host_view`]) runs on the host too, in the static
//! `hako-guest` executed with `--host-view`: it binds host directories
//! into the bundle's root in a mount namespace of its own, then becomes
//! `runsc`, and its cleaner removes the bundle once `runsc` exits. That
//! module is all the guest's binary links of this crate: everything else
//! (the backend, which needs the driver and the egress proxy) is behind
//! the default feature `backend`, so that the static guest stays small.

pub mod host_view;

#[cfg(feature = "backend")]
mod bundle;
#[cfg(feature = "backend")]
pub mod everyday;
#[cfg(feature = "backend")]
pub mod gc;
#[cfg(feature = "backend")]
mod sandbox;

#[cfg(feature = "backend")]
pub use bundle::{config_json, run_argv, view_argv, BundlePlan, SEAL_CAPABILITIES};
#[cfg(feature = "backend")]
pub use everyday::everyday_tools_work;
#[cfg(feature = "backend")]
pub use sandbox::{readiness, ready, runsc_path, GvisorConfig, GvisorSandbox};

/// The backend's name.
pub const NAME: &str = "gvisor";

/// The variable naming the `runsc` binary.
pub const RUNSC_VAR: &str = "HAKO_RUNSC";
