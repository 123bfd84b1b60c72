//! The hako sandbox interface.
//!
//! Every effect an agent causes (running a command, reading or writing a
//! file) goes through one [`Sandbox`]. How strongly a sandbox separates that
//! effect from the host is a typed, ordered property ([`Isolation`]) that
//! policy can compare, and [`Capabilities`] report only what a backend
//! actually enforces.
//!
//! This crate is pure data and traits: it makes no OS calls and contains no
//! `unsafe`. Backends live in their own crates and depend on this one.

mod capabilities;
mod command;
pub mod env;
mod error;
mod fs;
mod isolation;
pub mod network;
pub mod path;
mod sandbox;
mod spec;
pub mod units;

pub use capabilities::{
    Capabilities, FenceResolver, LimitKind, LimitMechanism, LimitReport, Limits, NetworkAccess,
    Optional, Shared,
};
pub use command::{Command, ExitStatus, Output, Program, DEFAULT_MAX_OUTPUT};
pub use error::{Error, FenceError, Result};
pub use fs::{DirEntry, DirListing, FileKind, Metadata, ReadOutcome};
pub use isolation::{Isolation, ParseIsolationError};
pub use network::{NetDecision, NetEvent, NetMode, NetProtocol, NetworkPolicy};
pub use sandbox::{
    exec_or_detach, replace_if_unchanged, require_isolation, write_file_creating_parents,
    AppendFile, ExecStream, MakeDirAll, NetworkEvents, OutputSink, OutputSlice, ProcessId,
    ProcessState, Processes, ReadLimit, ReplaceUnchanged, Sandbox, SessionId, SessionOptions,
    Sessions, SpawnOptions, StatPath, Stream, TermSize, Waited, Workdir,
};
pub use spec::{CowLayers, SandboxSpec, DEFAULT_MAX_PROCESSES, DEFAULT_MAX_SESSIONS};
