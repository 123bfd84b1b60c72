//! Choosing and opening a backend: what every front end shares.
//!
//! Every front end (`hako run`, `shell` and `fs`, the sandboxes `hako mcp`
//! and `hako serve` open, library users) describes a sandbox with one
//! [`SandboxSpec`], parsed once from its flags and a profile
//! ([`SandboxFlags::spec`]; the flags' value parsers are here too), names
//! a backend with a [`BackendArg`] (`auto` or a backend), turns it into a
//! [`BackendKind`] with [`resolve`] and gets a `Box<dyn Sandbox>` from
//! [`open`] (or, for a server that opens many alike, from an [`Opener`],
//! which also gates them by the isolation required):
//!
//! ```no_run
//! use hako_runtime::{open, resolve, BackendArg, SandboxSpec};
//!
//! # fn main() -> Result<(), hako_core::Error> {
//! let sandbox = open(resolve(BackendArg::Auto)?, &SandboxSpec::new("/tmp/ws".into()))?;
//! let out = sandbox.exec(&hako_core::Command::new(["true"]))?;
//! # let _ = out;
//! # Ok(())
//! # }
//! ```
//!
//! It also owns asking the host which backends work and why the others do
//! not ([`probe`], cheap; [`check`], which opens one and runs `true`;
//! [`protections`], the kernel features the `linux` backend applies), which
//! `hako doctor` prints and `auto` relies on.
//!
//! A copy-on-write workspace (`--cow`, `--name`, `--state`) is part of
//! the [`Plan`] the flags describe: an [`Opener`] made from it makes and
//! holds each sandbox's layers ([`cow`]), and the review operations every
//! front end offers on them are there too.
//!
//! The bearer token the HTTP front ends require is made and compared in
//! [`token`], below both of them.
//!
//! The choice is a closed enum and the spec plain data, so what is pure
//! here (parsing names, refusing settings a backend cannot honour) is
//! tested without privileges. This crate sits above the backends
//! (`hako-host`, `hako-linux`, `hako-docker`, `hako-gvisor`), which know nothing of it.

mod backend;
mod bounded;
pub mod cow;
mod flags;
pub mod http;
pub mod limits;
mod open;
mod probe;
mod profile;
pub mod token;

pub use backend::{
    choose_auto, choose_auto_with, resolve, AutoChoice, BackendArg, BackendKind, ParseBackendError,
};
pub use cow::{CowHold, CowRequest};
pub use flags::{parse_key_value, parse_resolve, parse_size, parse_size_u64, Plan, SandboxFlags};
pub use hako_core::{SandboxSpec, DEFAULT_MAX_PROCESSES, DEFAULT_MAX_SESSIONS};
pub use hako_driver::{DriverOptions, ExitFollowsClose};
pub use limits::parse_cpus;
pub use open::{open, open_with, Opener};
pub use probe::{
    check, fit_for_auto, preflight, probe, probe_for_auto, protections, Protection, Unavailable,
};
