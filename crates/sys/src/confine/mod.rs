//! The last restrictions put on the command's process before `exec`:
//! resource limits, Landlock, `no_new_privs` and an empty capability set.
//!
//! The supervisor calls these in the child it forked for the command, in this
//! order, each phase relying on what the one before left:
//!
//! 1. [`apply_rlimits`]: needs no privilege to lower a limit, and would need
//!    `CAP_SYS_RESOURCE` to raise a hard one, which it never does.
//! 2. [`landlock_restrict_writes`]: `landlock_restrict_self` needs either
//!    `no_new_privs` or `CAP_SYS_ADMIN` in the user namespace; the `landlock`
//!    crate sets `no_new_privs` itself just before, so this works unprivileged.
//!    The domain is inherited across `fork` and `exec` and cannot be lifted.
//! 3. [`set_no_new_privs`]: already set by step 2 when it ran; setting it
//!    again is harmless, and it must hold even when Landlock was skipped.
//!    From here on `exec` can grant no privilege (no set-user-ID, no file
//!    capabilities).
//! 4. [`drop_all_capabilities`]: the securebits and the bounding set need
//!    `CAP_SETPCAP`, so they are handled while it is still held; the final
//!    `capset` to zero removes it with everything else.
//! 5. seccomp (elsewhere), last, so that its filter need not allow the calls
//!    above.
//!
//! Every function returns a [`ConfineError`] naming the step that failed,
//! the OS error and a hint; `From<ConfineError> for io::Error` keeps `?`
//! working in callers that speak `io::Result`.
//!
//! One module per step: `limits`, `landlock`, `caps`; `error` holds the
//! error they share.

mod caps;
mod error;
mod landlock;
mod limits;

pub use self::caps::{
    drop_all_capabilities, drop_capabilities_keeping, learn_capabilities, CapsDropped,
};
pub use self::error::ConfineError;
pub use self::landlock::{
    landlock_abi, landlock_policy_status, landlock_prepare_policy, landlock_prepare_writes,
    landlock_restrict_self_with, landlock_restrict_writes, LandlockPolicy, LandlockRules,
    LandlockStatus, PolicyStatus, PreparedLandlock,
};
pub use self::limits::{apply_rlimits, Resource, Rlimit};

use rustix::thread as rt;

/// Sets `no_new_privs` on the calling thread (inherited by its children and
/// kept across `exec`): from now on `exec` grants no privilege, neither
/// set-user-ID/set-group-ID bits nor file capabilities.
pub fn set_no_new_privs() -> Result<(), ConfineError> {
    rt::set_no_new_privs(true).map_err(|e| ConfineError::NoNewPrivs(e.into()))
}
