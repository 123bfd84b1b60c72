//! The cases. Each is a function `fn(&Harness) -> Outcome` named like its
//! test; the list in `__hako_with_case_names!` is the one place that makes a
//! function a case (an unlisted case is dead code, which the lints refuse).

/// Defines a case: the body returns `Res`, so the check macros and `?` can
/// end it early with a failure or a skip.
macro_rules! case {
    ($(#[$meta:meta])* fn $name:ident($h:ident) $body:block) => {
        $(#[$meta])*
        pub(crate) fn $name($h: &$crate::Harness) -> $crate::Outcome {
            fn body($h: &$crate::Harness) -> $crate::check::Res $body
            match body($h) {
                Ok(()) => $crate::Outcome::Passed,
                Err(outcome) => outcome,
            }
        }
    };
}

mod cwd;
mod env;
mod exec;
mod faults;
mod fence;
mod files;
mod lifecycle;
mod output;
mod processes;
mod race;
mod sessions;
mod special;
mod tree;

pub(crate) use cwd::*;
pub(crate) use env::*;
pub(crate) use exec::*;
pub(crate) use faults::*;
pub(crate) use fence::*;
pub(crate) use files::*;
pub(crate) use lifecycle::*;
pub(crate) use output::*;
pub(crate) use processes::*;
pub(crate) use race::*;
pub(crate) use sessions::*;
pub(crate) use special::*;
pub(crate) use tree::*;
