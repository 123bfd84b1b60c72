//! hako's benchmark (`hako bench`): each backend against the tool it
//! stands in for, measured in the same run.
//!
//! What is measured against what:
//!
//! - **Cold**: a whole `hako run --backend B -- true` process against the
//!   reference tool for that backend: a plain fork/exec of `true` for
//!   `host`, bubblewrap (every namespace, a read-only view of the host, a
//!   new /proc and /dev) for `linux`, `docker run --rm` of the same image
//!   for `docker` (and again with `--runtime runsc` where the daemon has
//!   it, as `docker+runsc`), `runsc do` for `gvisor`.
//! - **Warm**: `true` run in an open sandbox through the library, against
//!   a plain fork/exec, against `docker exec` into a running container
//!   where Docker works (for `gvisor`, into a runsc container too), for
//!   `docker` against its own `docker exec` mode (`--no-guest`), and for
//!   `linux` against a new bubblewrap sandbox per call.
//! - **Fence**: writes and reads of 4 KiB and 1 MiB through the sandbox's
//!   file fence, against `std::fs` on the same files.
//! - **SDKs** (`--sdk-python`): one `commands.run("true")` through E2B's
//!   `e2b` SDK against `hako serve --e2b`, against the same call through
//!   hako's own Python SDK against `hako serve`, on the same backend.
//! - **Proxy** (`linux`): 100 MiB from a host service to `cat` inside,
//!   through the egress proxy, against the same `bash` and `cat` reading
//!   it over the host's loopback.
//!
//! Every figure is a median over many runs, and every hako figure is reported
//! with its reference measured in the same loop, one run of each in turn, as
//! a ratio (hako / reference): the ratio is what carries from one machine to
//! another, and alternating keeps the machine's drift out of it.
//!
//! [`run`] measures and returns a [`Report`], which prints as a table
//! ([`Report::table`]) or as JSON ([`Report::to_json`]); the `hako bench`
//! subcommand parses its flags and calls it.
//!
//! - **Load** ([`run_load`], `hako bench --load`): many sandboxes opened at
//!   once through the HTTP API of a `hako serve` it starts on loopback,
//!   commands run in each from concurrent clients, against the same work
//!   done with `docker run -d` and `docker exec`.
//!
//! - **Copy-on-write** ([`run_cow`], `hako bench --cow`, `linux`): a
//!   write-heavy job (untar 20,000 small files, rewrite a tenth) and a
//!   rewrite of existing files (copy-up) in a `--cow` sandbox against a
//!   plain one, and `hako diff` of 100 changes in a 100,000-file
//!   workspace against `git status` of the same tree.
//!
//! Modules: `load` (the load benchmark, and `http` its client), `measure`
//! (timing and statistics), `reference` (the reference tools), `runs` (one
//! backend's cold, warm and fence runs), `sdk` (the SDKs' round trip), `proxy` (the egress proxy's
//! throughput), `cow` (the copy-on-write figures, and `trees` the trees
//! and tar they work on), `report` (the findings and their printing).

mod cow;
mod http;
mod load;
mod measure;
mod proxy;
mod reference;
mod report;
mod runs;
mod sdk;
mod trees;
mod vm;

use std::path::PathBuf;

use hako_runtime::{BackendArg, BackendKind};

pub use cow::{figure as cow_figure, CowFindings, CowOptions, Walked, DIFF_CHANGES, WRITE_GOAL};
pub use load::{run_load, LoadOptions, LoadReport, LoadSide};
pub use measure::Stats;
pub use report::{Comparison, Reference, Report, Table, Throughput};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// The backends to measure, in order; none means `host`.
    pub backends: Vec<BackendArg>,
    /// Runs per measurement (at least one is made).
    pub iterations: usize,
    /// The `hako` executable whose `hako run` is timed cold, and whose
    /// linking is reported; `None`: this process's own executable (what
    /// `hako bench` measures).
    pub hako: Option<PathBuf>,
    /// A Python with the `e2b` and `hako` packages: on each backend, one
    /// `commands.run("true")` through E2B's SDK (`hako serve --e2b`) is
    /// measured against the same call through hako's own Python SDK
    /// (`hako serve`); `None`: not measured.
    pub sdk_python: Option<PathBuf>,
}

/// The benchmark could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot create {}: {source}", path.display())]
pub struct WorkspaceError {
    /// The scratch workspace the sandboxes were to share.
    pub path: PathBuf,
    /// Why it could not be created.
    pub source: std::io::Error,
}

/// Measures each backend of `options` against its references, then the
/// reference tools on their own. A backend that cannot be measured is
/// reported in [`Report::errors`], and the others are still measured; only
/// a scratch workspace that cannot be created stops the run.
///
/// Call it while this process has one thread: the `linux` backend's guest
/// then runs in a fork of it, and no `hako-guest` binary is needed.
pub fn run(options: &Options) -> Result<Report, WorkspaceError> {
    let n = options.iterations;
    let requested = if options.backends.is_empty() {
        vec![BackendArg::Host]
    } else {
        options.backends.clone()
    };
    let hako = || match &options.hako {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe().map_err(|e| e.to_string()),
    };
    let workspace = std::env::temp_dir().join(format!("hako-bench-{}", std::process::id()));
    let mut report = Report::new(n, report::linkage(hako().ok().as_deref()));
    if let Err(source) = std::fs::create_dir_all(&workspace) {
        return Err(WorkspaceError {
            path: workspace,
            source,
        });
    }
    for arg in requested {
        let result = hako_runtime::resolve(arg)
            .map_err(|e| e.to_string())
            .and_then(|kind| {
                let hako = hako()?;
                runs::bench_backend(kind, None, &hako, n, &workspace, &mut report.comparisons)?;
                if let Some(python) = &options.sdk_python {
                    match sdk::bench_sdks(kind, &hako, python, n, &workspace) {
                        Ok(c) => report.comparisons.push(c),
                        Err(e) => report.errors.push(format!("{arg:?}: the SDKs: {e}")),
                    }
                }
                if kind == BackendKind::Linux {
                    report
                        .throughput
                        .extend(proxy::bench_proxy_transfer(n, &workspace)?);
                }
                // docker on gVisor too, where the daemon has it.
                if kind == BackendKind::Docker
                    && hako_docker::ready(&reference::default_image(), Some("runsc")).is_ok()
                {
                    runs::bench_backend(
                        kind,
                        Some("runsc"),
                        &hako,
                        n,
                        &workspace,
                        &mut report.comparisons,
                    )?;
                }
                Ok(())
            });
        if let Err(e) = result {
            report.errors.push(format!("{arg:?}: {e}"));
        }
    }
    report.references = reference::references(n);
    report.index_figures();
    let _ = std::fs::remove_dir_all(&workspace);
    Ok(report)
}

/// Measures the copy-on-write figures on `linux` (see [`CowOptions`]): the
/// ratios are among [`Report::comparisons`] (backend `linux`), and the
/// rest in [`Report::cow`]. A part that cannot be measured is reported in
/// [`Report::errors`]; only a scratch directory that cannot be created
/// stops the run.
///
/// Call it while this process has one thread, as [`run`].
pub fn run_cow(options: &CowOptions) -> Result<Report, WorkspaceError> {
    let exe = match &options.hako {
        Some(path) => Some(path.clone()),
        None => std::env::current_exe().ok(),
    };
    let mut report = Report::new(options.iterations.max(1), report::linkage(exe.as_deref()));
    let scratch = std::env::temp_dir().join(format!("hako-bench-cow-{}", std::process::id()));
    if let Err(source) = std::fs::create_dir_all(&scratch) {
        return Err(WorkspaceError {
            path: scratch,
            source,
        });
    }
    let findings = cow::bench_cow(
        options,
        &scratch,
        &mut report.comparisons,
        &mut report.errors,
    );
    report.cow = Some(findings);
    report.index_figures();
    let _ = cow::remove_scratch(&scratch);
    Ok(report)
}
