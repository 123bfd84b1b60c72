//! `hako-guest`: the supervisor that runs inside the boundary.
//!
//! hako starts the guest with the command's stdio already attached and a
//! control socket at fd 3. The guest reads one [`proto::RunRequest`], starts
//! the command in a new session, becomes the child subreaper of everything it
//! spawns, and then waits for three things at once: the command's exit, the
//! deadline, and the control socket (end of file there means hako is gone or
//! gave up, and everything is killed). Whatever happens, before it replies it
//! kills and reaps every process the command left behind, including those
//! that called `setsid` or double-forked: they were re-parented to the guest.
//!
//! This is the seed of the long-lived guest of the design (sessions, PTYs,
//! file operations over one framed protocol); today it serves one command.

pub mod client;
mod confine;
mod linux;
pub mod proto;
pub mod sandbox;
pub mod supervise;
