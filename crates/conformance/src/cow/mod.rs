//! The copy-on-write kit: what `--cow` means, written once and run by
//! each backend that has it (linux, docker, gvisor) on sandboxes it opens
//! on a given workspace with given layers ([`CowLayers`]).
//!
//! ```ignore
//! hako_conformance::cow_tests!(linux_cow, |ws: &Path, cow: CowLayers| {
//!     let mut config = LinuxConfig::new(ws);
//!     config.spec.cow = Some(cow);
//!     Ok(Box::new(LinuxSandbox::new(config)?))
//! });
//! ```
//!
//! Each case makes its own world: a workspace, an `outside` directory of
//! sentinels beside it, and a named sandbox's state ([`State::create`] in
//! a state root beside both), and opens as many sandboxes on the same
//! layers as it needs. It looks at the sandbox only through the
//! [`Sandbox`] trait (what commands and the file API see) and reviews,
//! commits, discards, checkpoints and rolls back with `hako_layers`, as
//! `hako diff`, `commit`, `discard`, `checkpoint` and `rollback` do.
//! What a sandbox "saw" is listed by a command inside (`find`, `stat`,
//! `sha256sum`, `readlink`: busybox has them all): every entry's type and
//! mode bits, a file's SHA-256, a symlink's target.
//!
//! The cases (`review`): the real workspace is unchanged byte for byte
//! while the diff shows every change; a commit makes the workspace what
//! the sandbox saw; a discard leaves nothing; a second sandbox continues
//! on the layers; checkpoints and rollback; the file API reads and writes
//! the layered view. The attacks of issue 23's item 6 (`attacks`), each
//! named after itself. Every case ends by checking that the sandbox, or a
//! fresh one on the same layers, still works, and that nothing outside
//! the workspace changed.
//!
//! [`State::create`]: hako_layers::state::State::create

mod attacks;
mod review;
mod world;

#[cfg(test)]
mod naive;

use std::path::Path;
use std::sync::Arc;

use hako_core::{CowLayers, Error, Sandbox};

use crate::Outcome;

use attacks::*;
use review::*;

/// Opens the sandbox under test on a workspace (its host path) with the
/// given layers (`--cow`).
pub type CowFactory = dyn Fn(&Path, CowLayers) -> Result<Box<dyn Sandbox>, Error> + Send + Sync;

/// Pins a closure's signature down as a [`CowFactory`].
pub fn cow_factory<F>(f: F) -> Arc<CowFactory>
where
    F: Fn(&Path, CowLayers) -> Result<Box<dyn Sandbox>, Error> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// One copy-on-write case.
#[derive(Debug, Clone, Copy)]
pub struct CowCase {
    /// Its name (and the generated test's).
    pub name: &'static str,
    /// Runs it: `Err` carries a failure or a skip.
    pub run: fn(&CowFactory) -> Result<(), Outcome>,
}

/// The single list of cases: each becomes an entry of [`cow_cases`] and
/// a `#[test]` in every [`cow_tests!`](crate::cow_tests) instantiation.
#[doc(hidden)]
#[macro_export]
macro_rules! __hako_with_cow_case_names {
    ($($args:tt)*) => {
        $crate::__hako_expand_cow_cases! { [$($args)*]
            // review
            a_cow_sandbox_leaves_the_workspace_unchanged_and_the_diff_shows_every_change,
            a_commit_makes_the_workspace_exactly_what_the_cow_sandbox_saw,
            a_discard_leaves_nothing_and_the_next_sandbox_sees_the_workspace,
            a_second_cow_sandbox_on_the_same_layers_continues_on_them,
            checkpoints_roll_the_view_back_and_compare_two_points,
            the_file_api_reads_and_writes_the_layered_view_and_agrees_with_commands,
            // attacks (issue 23, item 6)
            a_symlink_in_the_layer_pointing_outside_is_committed_as_a_symlink_and_never_followed,
            a_device_fifo_socket_setuid_or_setgid_file_made_in_the_layer_is_refused_at_commit,
            a_whiteout_or_opaque_dir_cannot_delete_anything_outside_the_workspace,
            a_file_swapped_for_a_symlink_between_diff_and_commit_is_refused_by_expect,
            the_upper_layer_and_state_directory_are_not_reachable_from_inside_but_through_the_view,
            a_rename_of_a_directory_of_10000_files_is_reviewed_and_committed,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __hako_expand_cow_cases {
    ([@tests $module:ident, $factory:expr] $($name:ident),* $(,)?) => {
        #[allow(unused_imports)]
        mod $module {
            use super::*;

            fn __hako_cow_factory() -> ::std::sync::Arc<$crate::cow::CowFactory> {
                $crate::cow::cow_factory($factory)
            }

            $(
                #[test]
                fn $name() {
                    $crate::cow::run_cow_test(stringify!($name), __hako_cow_factory().as_ref());
                }
            )*
        }
    };
    ([@names] $($name:ident),* $(,)?) => {
        &[$(stringify!($name)),*]
    };
    ([@table] $($name:ident),* $(,)?) => {
        &[$(
            $crate::cow::CowCase {
                name: stringify!($name),
                run: $name,
            }
        ),*]
    };
}

/// Expands to a module named `$module` with one `#[test]` per
/// copy-on-write case, each opening its sandboxes with `$factory`, a
/// closure `|workspace: &Path, layers: CowLayers| -> Result<Box<dyn
/// Sandbox>, hako_core::Error>`. The module does `use super::*`.
#[macro_export]
macro_rules! cow_tests {
    ($module:ident, $factory:expr $(,)?) => {
        $crate::__hako_with_cow_case_names! { @tests $module, $factory }
    };
}

/// Every case, in the order of the list.
pub fn cow_cases() -> &'static [CowCase] {
    const CASES: &[CowCase] = __hako_with_cow_case_names!(@table);
    CASES
}

/// Runs one case by name: how it ended (a panic is a failure).
pub fn run_cow_case(name: &str, make: &CowFactory) -> Outcome {
    let Some(case) = cow_cases().iter().find(|c| c.name == name) else {
        return Outcome::Failed(format!("no copy-on-write case named {name:?}"));
    };
    crate::harness::prepare_process();
    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (case.run)(make)));
    match ran {
        Ok(Ok(())) => Outcome::Passed,
        Ok(Err(outcome)) => outcome,
        Err(panic) => Outcome::Failed(format!(
            "the case panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    }
}

/// Runs one case as a test (see [`crate::run_test`]).
pub fn run_cow_test(name: &str, make: &CowFactory) {
    match run_cow_case(name, make) {
        Outcome::Passed => {}
        Outcome::Failed(message) => panic!("{name} failed: {message}"),
        Outcome::Skipped(reason) if crate::must_work() => {
            panic!("{name} was skipped but HAKO_MUST_WORK=1: {reason}")
        }
        Outcome::Skipped(reason) => eprintln!("SKIPPED {name}: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MACRO_NAMES: &[&str] = __hako_with_cow_case_names!(@names);

    #[test]
    fn the_cow_macro_list_and_cases_agree_and_are_sentences() {
        let table: Vec<&str> = cow_cases().iter().map(|c| c.name).collect();
        assert_eq!(table, MACRO_NAMES);
        let mut seen = std::collections::BTreeSet::new();
        for name in table {
            assert!(seen.insert(name), "{name} is listed twice");
            assert!(name.split('_').count() >= 4, "{name} is not a sentence");
        }
    }

    #[test]
    fn an_unknown_cow_case_fails_and_a_backend_without_cow_skips() {
        let unsupported = cow_factory(|_ws: &Path, _cow: CowLayers| {
            Err(Error::Unsupported {
                backend: "none".into(),
                capability: "--cow",
            })
        });
        assert!(matches!(
            run_cow_case("no_such_case", unsupported.as_ref()),
            Outcome::Failed(_)
        ));
        for case in cow_cases() {
            assert!(
                matches!(
                    run_cow_case(case.name, unsupported.as_ref()),
                    Outcome::Skipped(_)
                ),
                "{}",
                case.name
            );
        }
    }
}
