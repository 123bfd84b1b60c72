//! Choosing and opening a backend: what every front end shares.
//!
//! Every front end (`hako run`, `shell` and `fs`, the sandboxes `hako mcp`
//! and `hako serve` open, library users) describes a sandbox with one
//! [`SandboxSpec`], names a backend with a [`BackendArg`] (`auto` or a
//! backend), turns it into a [`BackendKind`] with [`resolve`] and gets a
//! `Box<dyn Sandbox>` from [`open`]:
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
//! The choice is a closed enum and the spec plain data, so what is pure
//! here (parsing names, refusing settings a backend cannot honour) is
//! tested without privileges. This crate sits above the backends
//! (`hako-host`, `hako-linux`, `hako-container`), which know nothing of it.

mod backend;
mod open;
mod probe;
mod spec;

pub use backend::{resolve, BackendArg, BackendKind, ParseBackendError};
pub use hako_driver::{DriverOptions, ExitFollowsClose};
pub use open::{open, open_with};
pub use probe::{check, probe, protections, Protection, Unavailable};
pub use spec::SandboxSpec;
