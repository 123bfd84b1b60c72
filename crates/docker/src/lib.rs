//! The `docker` backend: one locked-down container per sandbox, started
//! once through the Docker or Podman CLI with the static guest as its
//! entrypoint; every command is a protocol round trip to that guest.
//!
//! What it enforces: the runtime's namespaces (no network but loopback),
//! a read-only root with a size-limited private `/tmp`, no capabilities,
//! `no-new-privileges`, hako's seccomp policy rendered to the runtime's
//! profile, the invoking user's uid and gid, cgroup limits through the
//! runtime, and the workspace as the only writable host directory. With
//! `--runtime runsc` the container runs on gVisor's kernel (Isolation
//! Kernel). What it does not: with runc or crun the container shares the
//! host kernel, and a kernel bug is an escape; the daemon (dockerd) runs
//! as root, so access to its socket is root on the host.
//!
//! With `--cow` the workspace is mounted through an overlay volume of the
//! engine's local driver instead of bound, every change landing in the
//! sandbox's upper layer (see the `cow` module): the workspace itself is
//! never written.

mod cow;
pub mod exec_mode;
pub mod gc;
pub mod plan;
mod sandbox;

pub use exec_mode::DockerExecSandbox;
pub use plan::{
    check_run_plan, is_gvisor_runtime, keeper_argv, run_argv, volume_create_argv,
    write_seccomp_profile, CowVolume, RunPlan,
};
pub use sandbox::{readiness, ready, DockerConfig, DockerSandbox};

/// The backend's name.
pub const NAME: &str = "docker";

/// The image used when none is named: what `hako image build` makes.
pub const DEFAULT_IMAGE: &str = "hako-busybox:latest";
