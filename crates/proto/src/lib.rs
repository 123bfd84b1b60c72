//! The framed messages between hako and the guest.
//!
//! A frame is a 4-byte big-endian length and that many bytes: JSON for a
//! control message ([`ToGuest`], [`FromGuest`]), or a tagged chunk of a
//! command's output or input ([`Frame`]). Frames are bounded by
//! [`MAX_FRAME`]: a larger length is refused before anything is read into
//! memory.
//!
//! What both sides of the boundary share, and nothing else: hako's side
//! (the driver) and the guest inside each depend on this crate and on
//! neither of each other's code.

mod fds;
mod frame;
mod linux;
mod messages;

pub use fds::*;
pub use frame::*;
pub use linux::*;
pub use messages::*;

/// The protocol version the guest speaks. Version 2 added the network
/// spec, version 3 the seal ([`Seal`]), version 4 the seal's guard
/// ([`Seal::guard`]), version 5 the seal's process limit
/// ([`Seal::pids_max`]), version 6 the memory watch ([`MemoryWatch`],
/// [`LinuxSpec::oom_counter`]) and `oom_killed`: a guest that would ignore any of them must refuse
/// the handshake instead.
pub const VERSION: u32 = 6;
