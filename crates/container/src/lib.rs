//! hako's container backends, each a launcher for the same in-sandbox
//! guest as `host` and `linux`:
//!
//! - [`docker`]: one locked-down container per sandbox through the Docker
//!   or Podman CLI (any OCI runtime the daemon knows, `runsc` included);
//! - [`gvisor`]: gVisor's `runsc` driven directly with an OCI bundle hako
//!   writes, no daemon.
//!
//! Both mount the statically linked `hako-guest` read-only as the
//! container's entrypoint and speak the guest's protocol over the runtime
//! client's stdin and stdout, so a command is one round trip, not a
//! `docker exec`.

mod common;
pub mod docker;
pub mod engine;
pub mod exec_mode;
pub mod gc;
pub mod gvisor;
pub mod image;
pub mod private;
pub mod runner;

pub use common::{is_static_elf, locate_static_guest, Owner, GUEST_INSIDE, STATIC_GUEST_VAR};
pub use docker::{DockerConfig, DockerSandbox};
pub use engine::{Engine, EngineKind};
pub use exec_mode::DockerExecSandbox;
pub use gvisor::{GvisorConfig, GvisorSandbox};
