//! How the guest's processes exit.
//!
//! hako reads little from these codes: a guest that ended after its link
//! closed exited with [`GuestExit::Success`], anything else did not end
//! cleanly (the reason, where the guest could say it, came first as a
//! `Refused` or `Failed` frame). The other numbers tell apart, for whoever
//! reads a process's status, where a guest gave up. They are kept as they
//! have been: do not renumber them.
//!
//! Two codes come from the binary's start-up (`hako_sys::entry_point!`),
//! not from here: 125 when Rust's runtime cannot start, 101 on a panic.

/// The exit code of one of the guest's processes: the guest (`hako-guest`,
/// or the fork of hako running its code), a `linux` sandbox's launcher and
/// pid 1, a supervisor, the network forwarder, and `--host-view`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GuestExit {
    /// Served until hako closed the link (the guest, pid 1); the sandbox's
    /// pid 1 is gone (its launcher); no more jobs will come (a supervisor);
    /// a bundle was removed (`--host-view`'s cleaner).
    Success = 0,
    /// A `linux` sandbox could not be built or served (its launcher or pid
    /// 1; the reason goes to hako first where the link allows), the guest
    /// could not start serving (no signalfd), or the network forwarder could
    /// not start.
    Failed = 1,
    /// The link to hako or its handshake failed: no control socket at fd
    /// 3, a link that could not be set up, a handshake that is bad, of
    /// another version or asks for what this guest cannot do, or what it
    /// asked for (a seal, the network forwarder) failed; also `--host-view`
    /// given arguments it cannot read (a usage error).
    Handshake = 2,
    /// A supervisor could not write its report to the guest.
    ReportLost = 3,
    /// A `linux` sandbox's launcher was told its pid 1 has pid 0.
    NoPid1 = 4,
    /// A supervisor could not put its descriptors in place after its fork.
    SupervisorDescriptors = 10,
    /// A supervisor found no socket to the guest at fd 3.
    SupervisorSocket = 11,
    /// A supervisor found no Landlock ruleset at fd 4 where the sandbox has
    /// one.
    SupervisorLandlock = 16,
    /// Setting up failed before anything could run: the fork of hako that
    /// becomes the guest could not put its descriptors in place;
    /// `--host-view` could not start the bundle's cleaner or bind the root
    /// view. (As `docker run` does when it fails itself.)
    SetUp = 125,
    /// The fork of hako that becomes the guest could not hide hako's
    /// command line and environment, which must not show inside.
    Disguise = 126,
    /// `--host-view` could not execute its program (as a shell does for a
    /// command it cannot run).
    Exec = 127,
}

impl GuestExit {
    /// The number the process exits with.
    pub const fn code(self) -> u8 {
        self as u8
    }
}

impl From<GuestExit> for u8 {
    fn from(exit: GuestExit) -> u8 {
        exit.code()
    }
}

impl From<GuestExit> for i32 {
    fn from(exit: GuestExit) -> i32 {
        i32::from(exit.code())
    }
}

#[cfg(test)]
mod tests {
    use super::GuestExit;

    #[test]
    fn the_numbers_are_the_ones_hako_has_always_used() {
        for (exit, code) in [
            (GuestExit::Success, 0),
            (GuestExit::Failed, 1),
            (GuestExit::Handshake, 2),
            (GuestExit::ReportLost, 3),
            (GuestExit::NoPid1, 4),
            (GuestExit::SupervisorDescriptors, 10),
            (GuestExit::SupervisorSocket, 11),
            (GuestExit::SupervisorLandlock, 16),
            (GuestExit::SetUp, 125),
            (GuestExit::Disguise, 126),
            (GuestExit::Exec, 127),
        ] {
            assert_eq!(u8::from(exit), code, "{exit:?}");
            assert_eq!(i32::from(exit), i32::from(code), "{exit:?}");
        }
    }
}
