//! What hako's container backends (`hako-docker` and `hako-gvisor`) share,
//! with no backend in it: finding the static guest they run as the
//! container's entrypoint, the launcher that speaks to it over the runtime
//! client's stdio ([`ContainerLauncher`]), owner labels, the container's
//! network and limits, running the runtimes' CLIs ([`runner`]), which
//! engine `docker` is ([`engine`]), hako's private directory ([`private`])
//! and building the image both run on ([`image`]).

mod common;
pub mod engine;
pub mod image;
pub mod private;
pub mod runner;

pub use common::{
    base_env, cpus_decimal, gvisor_host_memory, is_static_elf, limit_reports,
    limit_reports_pids_inside, locate_static_guest, memory_by_the_guest, memory_watch,
    seccomp_profile, static_guest_hint, static_guest_ready, unique_name, ContainerLauncher,
    NotReady, Owner, RunNetwork, StderrTail, DEFAULT_TMP_SIZE, GUEST_INSIDE,
    GVISOR_MEMORY_HEADROOM, LABEL_PID, LABEL_START, STATIC_GUEST_BUILD, STATIC_GUEST_NAME,
    STATIC_GUEST_VAR,
};
pub use engine::{Engine, EngineKind};
