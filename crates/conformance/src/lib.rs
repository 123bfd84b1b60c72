//! The conformance kit: one suite of behaviour every hako backend passes
//! unchanged.
//!
//! The suite is written once over `&dyn Sandbox` and instantiated per backend
//! with [`conformance_tests!`], which expands to a module with one `#[test]`
//! per case. Test names are the case names: sentences about behaviour, and
//! escape regressions are named after the attack.
//!
//! ```ignore
//! use std::path::Path;
//! use hako_host::{HostConfig, HostSandbox};
//!
//! hako_conformance::conformance_tests!(host, |ws: &Path| {
//!     Ok(Box::new(HostSandbox::new(HostConfig::new(ws))?))
//! });
//! ```
//!
//! Each case gets a fresh [`Harness`]: a new workspace, a new sandbox built on
//! it by the backend's factory, and a separate "outside" directory of
//! sentinel files beside the workspace. A case plants hostile things (symlinks,
//! FIFOs, hard links, device nodes, a procfs mount) through the workspace's
//! host path, as a hostile process inside would, and checks what the code
//! inside sees through `exec` only, so a backend that runs commands in another
//! pid namespace, a container with the workspace bind-mounted, or a VM passes
//! the same cases. After every case the harness checks that nothing beside
//! the workspace changed and that no process the case started is left.
//!
//! A case ends [`Outcome::Passed`], [`Outcome::Failed`] or
//! [`Outcome::Skipped`] (with a reason, e.g. a root-only check run as a user).
//! A skip passes with the reason printed, unless `HAKO_MUST_WORK=1` is set
//! (CI sets it), which turns every skip into a failure.
//!
//! Beside the main suite: the network kit ([`net`], `network_tests!`), the
//! copy-on-write kit ([`cow`], `cow_tests!`: a `--cow` sandbox reviewed,
//! committed, discarded, checkpointed, and the attacks on its review),
//! and cases each backend calls with a sandbox it opened ([`memory`],
//! [`limits`], [`lost`], [`attacks`], [`terminal`]).
//!
//! Environment knobs:
//! - `HAKO_MUST_WORK=1`: skips fail.
//! - `HAKO_RACE_ITERATIONS`: iterations of the rename-race cases (default
//!   10 000; with `HAKO_MUST_WORK=1` fewer than 10 000 is a failure).
//! - `HAKO_CASE_DEADLINE_SECS`: a case that has not finished by then fails as
//!   hung (default 600).

pub mod attacks;
pub mod limits;
pub mod lost;
pub mod memory;
pub mod terminal;
#[macro_use]
mod check;
mod cases;
pub mod cow;
mod harness;
#[cfg(test)]
mod naive;
pub mod net;
mod procs;
mod soak;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hako_core::{Error, Sandbox};

pub use harness::Harness;
pub use procs::{host_processes_with_arg, sandbox_processes_with_arg};
pub use soak::{soak, SoakReport};

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Passed,
    /// A check failed; the message says which, with the values seen.
    Failed(String),
    /// The case could not run here; the message says why.
    Skipped(String),
}

/// One conformance case.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    /// The case's name, a sentence about behaviour in snake case; it is also
    /// the name of the generated `#[test]`.
    pub name: &'static str,
    /// Runs the case against a fresh harness.
    pub run: fn(&Harness) -> Outcome,
}

/// Builds the sandbox under test on a workspace directory (its host path).
pub type Factory = dyn Fn(&Path) -> Result<Box<dyn Sandbox>, Error> + Send + Sync;

/// The single list of cases. Every name here becomes an entry of [`cases`]
/// and a `#[test]` in every [`conformance_tests!`] instantiation, so adding
/// a case here adds it to every backend.
#[doc(hidden)]
#[macro_export]
macro_rules! __hako_with_case_names {
    ($($args:tt)*) => {
        $crate::__hako_expand_cases! { [$($args)*]
            // exec
            exit_codes_are_reported_exactly,
            a_command_killed_by_a_signal_reports_the_signal,
            stdout_and_stderr_are_kept_apart,
            stdin_is_delivered_byte_for_byte,
            stdin_the_command_does_not_read_does_not_block_it,
            no_stdin_means_end_of_file_at_once,
            a_missing_program_is_command_not_found,
            a_file_without_the_execute_bit_cannot_execute,
            a_malformed_command_is_invalid_and_runs_nothing,
            arguments_are_delivered_exactly_and_a_huge_one_is_an_error,
            concurrent_execs_get_their_own_output,
            exec_stream_delivers_the_same_bytes_as_the_output,
            exec_stream_delivers_output_while_the_command_runs,
            everyday_tools_ls_la_and_stat_work,
            // environment and descriptors
            command_env_adds_and_overrides_variables,
            host_secrets_do_not_reach_the_command,
            only_stdin_stdout_and_stderr_reach_the_command,
            // working directory
            cwd_runs_the_command_in_that_directory,
            cwd_outside_the_workspace_is_refused_and_nothing_runs,
            // deadlines and process trees
            timeout_kills_the_whole_process_tree,
            background_children_are_killed_when_the_command_exits,
            close_during_exec_kills_the_command,
            stopping_its_supervisor_does_not_let_a_command_outlive_its_deadline,
            stopping_the_idle_supervisors_does_not_hang_the_next_commands,
            // faults
            a_supervisor_killed_mid_command_ends_only_that_command,
            a_supervisor_killed_mid_session_ends_only_that_session,
            a_supervisor_killed_under_a_long_lived_process_ends_only_that_process,
            a_full_workspace_fails_writes_with_no_space_and_keeps_the_old_content,
            // output caps
            stdout_flood_is_capped_and_counted,
            stderr_flood_is_capped_and_counted,
            output_at_or_under_the_cap_is_not_truncated,
            a_ten_gib_output_flood_is_capped_and_counted_exactly,
            // file operations
            write_then_read_round_trips_binary_data,
            overwrite_is_atomic_and_leaves_no_temp_files,
            write_preserves_the_mode_of_an_existing_file,
            read_file_limit_reports_truncation_exactly,
            append_creates_then_appends,
            make_dir_all_creates_missing_parents,
            remove_deletes_files_empty_dirs_and_links_but_never_recurses,
            list_dir_is_sorted_and_reports_symlinks_as_symlinks,
            stat_reports_symlinks_without_following_them,
            file_errors_name_the_condition,
            absolute_paths_inside_the_workspace_are_accepted,
            symlinks_that_stay_inside_the_workspace_are_followed,
            paths_at_the_length_limits_work,
            // fence: escapes, each named after the attack
            dot_dot_escape_is_refused_by_every_operation,
            absolute_path_outside_is_refused_by_every_operation,
            symlink_to_outside_is_refused_by_every_operation,
            symlink_to_outside_in_an_intermediate_component_is_refused,
            dangling_symlink_never_creates_its_target,
            symlink_loop_is_refused,
            magic_link_symlinks_into_proc_are_refused,
            procfs_mounted_inside_the_workspace_cannot_be_used_to_escape,
            nul_byte_in_a_path_is_refused,
            over_long_paths_and_components_are_refused,
            reading_a_fifo_is_refused_without_blocking,
            reading_a_device_node_is_refused,
            hardlink_to_an_outside_file_is_never_written_through,
            symlink_swapped_during_write_and_read_is_refused,
            final_component_swapped_for_a_symlink_is_never_followed,
            // sessions
            session_keeps_cwd_variables_functions_and_jobs,
            session_output_and_status_are_delimited_exactly,
            session_timeout_kills_the_command_and_the_session_goes_on,
            session_command_past_its_deadline_runs_nothing_after_it,
            sessions_run_concurrently_and_stay_apart,
            closing_a_session_kills_its_jobs,
            a_session_that_exits_says_so_and_session_commands_are_checked,
            // long-lived processes
            process_output_is_read_from_offsets_and_its_end_is_memoised,
            a_process_with_live_stdin_answers_each_line,
            killing_a_process_kills_its_tree_and_is_idempotent,
            the_callers_wait_and_the_process_deadline_are_separate_clocks,
            a_callers_wait_that_expires_returns_a_handle_and_the_output_so_far,
            output_past_the_ring_is_reported_lost,
            a_process_on_a_terminal_sees_a_tty_its_size_and_typed_input,
            ctrl_c_reaches_the_terminal_program_and_deadlines_kill_it,
            // lifecycle
            closed_sandbox_refuses_every_operation,
            capabilities_match_the_optional_accessors,
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __hako_expand_cases {
    ([@tests $module:ident, $factory:expr] $($name:ident),* $(,)?) => {
        #[allow(unused_imports)]
        mod $module {
            use super::*;

            fn __hako_factory() -> ::std::sync::Arc<$crate::Factory> {
                $crate::factory($factory)
            }

            $(
                #[test]
                fn $name() {
                    $crate::run_test(stringify!($name), __hako_factory());
                }
            )*
        }
    };
    ([@names] $($name:ident),* $(,)?) => {
        &[$(stringify!($name)),*]
    };
    ([@table] $($name:ident),* $(,)?) => {
        &[$(
            $crate::Case {
                name: stringify!($name),
                run: $crate::cases::$name,
            }
        ),*]
    };
}

/// Expands to a module named `$module` with one `#[test]` per conformance
/// case, each running that case against a sandbox built by `$factory`, a
/// closure `|workspace: &Path| -> Result<Box<dyn Sandbox>, hako_core::Error>`.
///
/// The module does `use super::*`, so the factory may use names imported
/// where the macro is invoked.
#[macro_export]
macro_rules! conformance_tests {
    ($module:ident, $factory:expr $(,)?) => {
        $crate::__hako_with_case_names! { @tests $module, $factory }
    };
}

/// Every case, in the order of the list in [`conformance_tests!`].
pub fn cases() -> &'static [Case] {
    const CASES: &[Case] = __hako_with_case_names!(@table);
    CASES
}

/// Turns a closure into a [`Factory`], pinning down the closure's signature
/// so that `Ok(Box::new(sandbox))` coerces to `Box<dyn Sandbox>`.
pub fn factory<F>(f: F) -> Arc<Factory>
where
    F: Fn(&Path) -> Result<Box<dyn Sandbox>, Error> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// Whether `HAKO_MUST_WORK=1` is set: skips are failures.
pub fn must_work() -> bool {
    std::env::var_os("HAKO_MUST_WORK").is_some_and(|v| v == "1")
}

fn case_deadline() -> Duration {
    let secs = std::env::var("HAKO_CASE_DEADLINE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(600);
    Duration::from_secs(secs)
}

/// Runs one case by name on a fresh harness and returns how it ended.
///
/// The case runs on a thread of its own; one that has not finished by the
/// case deadline is reported as hung (the thread is left behind, so the
/// test fails instead of hanging the whole run).
pub fn run_case(name: &str, factory: Arc<Factory>) -> Outcome {
    let Some(case) = cases().iter().find(|c| c.name == name).copied() else {
        return Outcome::Failed(format!("no conformance case named {name:?}"));
    };
    harness::prepare_process();
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(case.name.to_string())
        .spawn(move || {
            let outcome = harness::run_in_fresh_harness(case, factory);
            let _ = tx.send(outcome);
        });
    let handle = match spawned {
        Ok(handle) => handle,
        Err(e) => return Outcome::Failed(format!("cannot start the case thread: {e}")),
    };
    let deadline = case_deadline();
    match rx.recv_timeout(deadline) {
        Ok(outcome) => {
            let _ = handle.join();
            outcome
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Outcome::Failed(format!(
            "the case did not finish within {deadline:?}: something hangs (set HAKO_CASE_DEADLINE_SECS to wait longer)"
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            let message = match handle.join() {
                Err(panic) => panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic with no message".into()),
                Ok(()) => "the case thread ended without an outcome".into(),
            };
            Outcome::Failed(format!("the case panicked: {message}"))
        }
    }
}

/// Runs one case as a test: panics when it fails, prints the reason and
/// returns when it is skipped (panics instead under `HAKO_MUST_WORK=1`).
pub fn run_test(name: &str, factory: Arc<Factory>) {
    match run_case(name, factory) {
        Outcome::Passed => {}
        Outcome::Failed(message) => panic!("{name} failed: {message}"),
        Outcome::Skipped(reason) if must_work() => {
            panic!("{name} was skipped but HAKO_MUST_WORK=1: {reason}")
        }
        Outcome::Skipped(reason) => eprintln!("SKIPPED {name}: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const MACRO_NAMES: &[&str] = __hako_with_case_names!(@names);

    #[test]
    fn the_macro_list_and_cases_agree() {
        let table: Vec<&str> = cases().iter().map(|c| c.name).collect();
        assert_eq!(table, MACRO_NAMES);
        assert!(table.len() >= 50, "only {} cases", table.len());
    }

    #[test]
    fn exclusive_cases_exist() {
        for name in harness::EXCLUSIVE {
            assert!(cases().iter().any(|c| c.name == *name), "{name}");
        }
    }

    #[test]
    fn case_names_are_unique_sentences() {
        let mut seen = std::collections::BTreeSet::new();
        for case in cases() {
            assert!(seen.insert(case.name), "{} is listed twice", case.name);
            assert!(
                case.name.split('_').count() >= 4,
                "{} is not a sentence",
                case.name
            );
            assert!(
                case.name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn an_unknown_case_fails_and_a_failing_factory_fails_every_case() {
        let broken = factory(|_ws: &Path| {
            Err(Error::InvalidCommand {
                reason: "no backend".into(),
            })
        });
        assert!(matches!(
            run_case("no_such_case", broken.clone()),
            Outcome::Failed(_)
        ));
        match run_case("exit_codes_are_reported_exactly", broken) {
            Outcome::Failed(message) => assert!(message.contains("no backend"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
}
