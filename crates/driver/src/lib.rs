//! `hako-driver`: hako's side of the boundary. It starts a sandbox's
//! guest (by executing `hako-guest`, in a fork of this process, or through
//! a container runtime's client), speaks the framed protocol of
//! [`proto`] to it, and turns its replies into `hako_core` results
//! ([`connection::Connection`]); [`sandbox::GuestSandbox`] is the sandbox
//! every backend shares once it has said how its guest starts (a
//! [`sandbox::Launcher`]). It also keeps long-lived processes' output
//! (`processes`) and starts the egress proxy ([`network`]).
//!
//! Nothing here runs inside a sandbox, and nothing here calls the guest's
//! code: a program that links the guest and wants it started in a fork of
//! itself hands its entry points over as a value ([`InProcessGuest`]).

pub mod cgroup;
pub mod connection;
pub mod network;
mod options;
mod processes;
mod recipe;
/// The wire protocol, shared with the guest (the `hako-proto` crate).
pub use hako_proto as proto;
pub mod sandbox;

pub use options::{DriverOptions, ExitFollowsClose, InProcessGuest, LaunchOptions};
