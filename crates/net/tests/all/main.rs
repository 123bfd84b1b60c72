//! The egress proxy over its unix socket, against servers on 127.0.0.1.
//!
//! Only loopback is ever connected to, and the system's resolver is never
//! asked (`Resolver::only_overrides`): names that must be refused resolve,
//! by override, to private or metadata addresses and are refused before any
//! connection is made.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod connect;
mod forward;
mod handoff;
mod lifecycle;
mod limits;
mod socks;
mod support;
mod throughput;
