//! The runs of one backend: a cold `hako run` against the tool the backend
//! stands in for, a warm exec in an open sandbox against a fork/exec and
//! `docker exec`, and the fence's reads and writes against `std::fs`.

use std::path::Path;

use hako_core::{Command, Sandbox};
use hako_runtime::{BackendKind, SandboxSpec};

use crate::measure::{measure, measure_pair};
use crate::reference::{
    bwrap_line, bwrap_true, default_image, find_in_path, fork_exec_true, status_ok,
    status_ok_piped, ReferenceContainer,
};
use crate::report::{compare, Comparison};

/// Runs `command` (`true`) in `sandbox`; an error unless it succeeded.
fn exec_true(sandbox: &dyn Sandbox, command: &Command) -> Result<(), String> {
    let out = sandbox.exec(command).map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("true exited {:?}", out.status))
    }
}

/// Measures backend `kind`, with `hako` the binary whose `hako run` is
/// timed cold, `n` runs each, in `workspace`, and adds its comparisons to
/// `out`. `runtime`: for `docker`, the OCI runtime (`runsc`), measured as a
/// backend of its own (`docker+runsc`).
pub(crate) fn bench_backend(
    kind: BackendKind,
    runtime: Option<&str>,
    hako: &Path,
    n: usize,
    workspace: &Path,
    out: &mut Vec<Comparison>,
) -> Result<(), String> {
    let label: &'static str = match runtime {
        Some(_) => "docker+runsc",
        None => kind.name(),
    };
    let runtime_args: Vec<&str> = runtime.map(|r| vec!["--runtime", r]).unwrap_or_default();
    let hako_run = || {
        status_ok(
            std::process::Command::new(hako)
                .args(["run", "--backend", kind.name()])
                .args(&runtime_args)
                .arg("--workspace")
                .arg(workspace)
                .args(["--", "true"]),
        )
    };
    // A VM's start-up is measured against a bare boot of its own image
    // and against a start from a snapshot (see `crate::vm`).
    let per_call = if kind == BackendKind::Vm {
        crate::vm::bench_starts(n, workspace, out)?;
        None
    } else {
        // Each backend against the tool it replaces, measured alternately.
        let (reference_name, reference_key, (cold, reference)) = match kind {
            BackendKind::Linux => {
                let bwrap = find_in_path("bwrap")
                    .ok_or("bwrap is not installed (apt-get install bubblewrap)")?;
                (
                    bwrap_line(),
                    "bwrap",
                    measure_pair(n, hako_run, || bwrap_true(&bwrap))?,
                )
            }
            BackendKind::Docker => {
                let image = default_image();
                let docker_run = || {
                    status_ok(
                        std::process::Command::new("docker")
                            .args(["run", "--rm", "--network", "none"])
                            .args(&runtime_args)
                            .args([&image, "true"]),
                    )
                };
                (
                    format!(
                        "docker run --rm --network none {}{image} true",
                        runtime
                            .map(|r| format!("--runtime {r} "))
                            .unwrap_or_default()
                    ),
                    "docker_run",
                    measure_pair(n, hako_run, docker_run)?,
                )
            }
            BackendKind::Gvisor => {
                let runsc = hako_gvisor::runsc_path(None);
                let root = workspace.join(".runsc-bench");
                let runsc_do = || {
                    status_ok_piped(
                        std::process::Command::new(&runsc)
                            .arg("--root")
                            .arg(&root)
                            .args(["--network=none", "do", "true"]),
                    )
                };
                (
                    format!("{} --network=none do true", runsc.display()),
                    "runsc_do",
                    measure_pair(n, hako_run, runsc_do)?,
                )
            }
            _ => (
                "fork/exec true".to_string(),
                "fork_exec",
                measure_pair(n, hako_run, fork_exec_true)?,
            ),
        };
        out.push(compare(
            format!("cold_run.ratio_vs_{reference_key}"),
            format!(
                "hako run --backend {} -- true (cold, whole process)",
                match runtime {
                    Some(r) => format!("docker --runtime {r}"),
                    None => label.to_string(),
                }
            ),
            Some(label),
            cold,
            &reference_name,
            reference,
        ));
        Some((reference_name, reference))
    };
    let mut spec = SandboxSpec::new(workspace.to_path_buf());
    spec.runtime = runtime.map(str::to_string);
    let sandbox = hako_runtime::open(kind, &spec).map_err(|e| e.to_string())?;
    let command = Command::new(["true"]);
    let (warm, fork) = measure_pair(n, || exec_true(sandbox.as_ref(), &command), fork_exec_true)?;
    out.push(compare(
        "warm_exec.ratio_vs_fork_exec".into(),
        format!("exec true in an open {} sandbox (library)", label),
        Some(label),
        warm,
        "fork/exec true",
        fork,
    ));
    // What a harness that runs each call through `docker exec` into a
    // running container pays, where Docker works: a runc container, and,
    // for gVisor's backends, one of the same isolation (Docker's runsc
    // runtime) where the daemon has it.
    let mut references = vec![runtime];
    if kind == BackendKind::Gvisor {
        references.push(Some("runsc"));
    }
    for runtime in references {
        let Ok(container) = ReferenceContainer::start(runtime) else {
            continue;
        };
        let (warm, docker_exec) = measure_pair(
            n,
            || exec_true(sandbox.as_ref(), &command),
            || container.exec_true(),
        )?;
        out.push(compare(
            format!(
                "warm_exec.ratio_vs_docker_exec_{}",
                runtime.unwrap_or("runc")
            ),
            format!("exec true in an open {} sandbox (library)", label),
            Some(label),
            warm,
            &format!(
                "docker exec (a running {} container)",
                runtime.unwrap_or("runc")
            ),
            docker_exec,
        ));
    }
    if kind == BackendKind::Docker && runtime.is_none() {
        // The fallback for images where the guest cannot run: a `docker
        // exec` per command.
        let mut spec = SandboxSpec::new(workspace.to_path_buf());
        spec.no_guest = true;
        let exec_mode = hako_runtime::open(kind, &spec).map_err(|e| e.to_string())?;
        let (warm, fallback) = measure_pair(
            n,
            || exec_true(sandbox.as_ref(), &command),
            || exec_true(exec_mode.as_ref(), &command),
        )?;
        exec_mode.close().map_err(|e| e.to_string())?;
        out.push(compare(
            "warm_exec.ratio_vs_docker_exec_mode".into(),
            "exec true in an open docker sandbox (library)".into(),
            Some(label),
            warm,
            "the same in docker exec mode (--no-guest)",
            fallback,
        ));
    }
    if let (BackendKind::Linux, Some((reference_name, reference))) = (kind, per_call) {
        // What a harness that wraps each call in bubblewrap pays per call.
        out.push(compare(
            "warm_exec.ratio_vs_bwrap_per_call".into(),
            format!("exec true in an open {} sandbox (library)", label),
            Some(label),
            warm,
            &format!("{reference_name} (a new sandbox per call)"),
            reference,
        ));
    }
    if runtime.is_none() {
        bench_fence(sandbox.as_ref(), kind, workspace, n, out)?;
    }
    sandbox.close().map_err(|e| e.to_string())
}

/// The fence's writes and reads of 4 KiB and 1 MiB through `sandbox`,
/// against `std::fs` on the same files.
fn bench_fence(
    sandbox: &dyn Sandbox,
    kind: BackendKind,
    workspace: &Path,
    n: usize,
    out: &mut Vec<Comparison>,
) -> Result<(), String> {
    for (label, key, size, reps) in [
        ("4 KiB", "4k", 4usize << 10, n * 20),
        ("1 MiB", "1m", 1 << 20, n * 2),
    ] {
        let data = vec![0x5au8; size];
        let name = format!("bench-{size}.bin");
        let rel = Path::new(&name);
        let abs = workspace.join(&name);
        let std_write = measure(reps, || {
            std::fs::write(&abs, &data).map_err(|e| e.to_string())
        })?;
        let hako_write = measure(reps, || {
            sandbox.write_file(rel, &data).map_err(|e| e.to_string())
        })?;
        out.push(compare(
            format!("fence_write_{key}.ratio_vs_std_fs_write"),
            format!(
                "{} fence write {label} (atomic: temp file + rename)",
                kind.name()
            ),
            Some(kind.name()),
            hako_write,
            "std::fs::write",
            std_write,
        ));
        let std_read = measure(reps, || {
            std::fs::read(&abs).map(|_| ()).map_err(|e| e.to_string())
        })?;
        let hako_read = measure(reps, || {
            sandbox
                .read_file(rel)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })?;
        out.push(compare(
            format!("fence_read_{key}.ratio_vs_std_fs_read"),
            format!("{} fence read {label}", kind.name()),
            Some(kind.name()),
            hako_read,
            "std::fs::read",
            std_read,
        ));
    }
    Ok(())
}
