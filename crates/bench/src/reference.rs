//! The reference tools hako is measured against: a plain fork/exec,
//! bubblewrap, `docker run` and `docker exec`, and the helpers that run
//! them.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use crate::measure::measure;
use crate::report::Reference;

/// Runs `cmd` with no input and its output discarded; an error unless it
/// succeeded.
pub(crate) fn status_ok(cmd: &mut std::process::Command) -> Result<(), String> {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {status}"))
    }
}

/// [`status_ok`] with pipes in place of `/dev/null`, for `runsc`, which
/// hands the files of a sandbox's standard streams to the sandbox's user
/// by changing their owner (for `/dev/null`, the host's own).
pub(crate) fn status_ok_piped(cmd: &mut std::process::Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(std::process::Child::wait_with_output)
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {}", out.status))
    }
}

/// Runs `true`, the plain fork/exec every exec is compared with.
pub(crate) fn fork_exec_true() -> Result<(), String> {
    status_ok(&mut std::process::Command::new("true"))
}

/// Where `name` is found in `PATH`.
pub(crate) fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// The reference for the linux backend: bubblewrap with every namespace, a
/// read-only view of the host, a new /proc and a minimal /dev (it applies no
/// Landlock, no seccomp and no cgroup; hako's linux backend does).
const BWRAP: [&str; 12] = [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "true",
    "",
];

/// The bubblewrap command line of the reference, as it is reported.
pub(crate) fn bwrap_line() -> String {
    BWRAP[..11].join(" ")
}

/// Runs `true` in a new bubblewrap sandbox, with `bwrap` at `path`.
pub(crate) fn bwrap_true(path: &Path) -> Result<(), String> {
    status_ok(std::process::Command::new(path).args(&BWRAP[1..11]))
}

/// The reference tools measured on their own, `n` runs each: a plain
/// fork/exec, and bubblewrap (skipped where it is not installed or fails).
pub(crate) fn references(n: usize) -> Vec<Reference> {
    let mut out = vec![Reference {
        tool: "fork/exec true".into(),
        stats: measure(n, fork_exec_true).ok(),
        skipped: None,
    }];
    let bwrap = bwrap_line();
    out.push(match find_in_path("bwrap") {
        Some(path) => match measure(n, || bwrap_true(&path)) {
            Ok(stats) => Reference {
                tool: bwrap,
                stats: Some(stats),
                skipped: None,
            },
            Err(e) => Reference {
                tool: bwrap,
                stats: None,
                skipped: Some(e),
            },
        },
        None => Reference {
            tool: bwrap,
            stats: None,
            skipped: Some("bwrap is not installed".into()),
        },
    });
    out
}

/// The image the container backends and their references run.
pub(crate) fn default_image() -> String {
    format!("{}:latest", hako_container::image::DEFAULT_NAME)
}

/// A running container of the default image, kept for `docker exec`
/// measurements (what a harness that runs each call through `docker exec`
/// pays); removed on drop.
pub(crate) struct ReferenceContainer {
    name: String,
}

impl ReferenceContainer {
    /// Starts one, on the OCI `runtime` given or the daemon's default.
    pub(crate) fn start(runtime: Option<&str>) -> Result<ReferenceContainer, String> {
        let name = format!(
            "hako-bench-ref-{}-{}",
            std::process::id(),
            runtime.unwrap_or("default")
        );
        let runtime_args: Vec<&str> = runtime.map(|r| vec!["--runtime", r]).unwrap_or_default();
        status_ok(
            std::process::Command::new("docker")
                .args(["run", "--detach", "--rm", "--init", "--network", "none"])
                .args(&runtime_args)
                .args([
                    "--name",
                    &name,
                    "--entrypoint",
                    "sleep",
                    &default_image(),
                    "100000",
                ]),
        )
        .map_err(|e| format!("cannot start a reference container: {e}"))?;
        Ok(ReferenceContainer { name })
    }

    /// Runs `true` in it through `docker exec`.
    pub(crate) fn exec_true(&self) -> Result<(), String> {
        status_ok(std::process::Command::new("docker").args(["exec", &self.name, "true"]))
    }
}

impl Drop for ReferenceContainer {
    fn drop(&mut self) {
        let _ = status_ok(std::process::Command::new("docker").args(["rm", "--force", &self.name]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bwrap_reference_runs_true_in_every_namespace_over_a_read_only_root() {
        assert_eq!(
            bwrap_line(),
            "bwrap --unshare-all --die-with-parent --ro-bind / / --proc /proc --dev /dev true"
        );
    }

    #[test]
    fn status_ok_tells_success_from_failure_and_a_missing_program() {
        assert_eq!(fork_exec_true(), Ok(()));
        let failed = status_ok(&mut std::process::Command::new("false"));
        assert!(failed.is_err_and(|e| e.contains("false")));
        let missing = status_ok(&mut std::process::Command::new("hako-bench-no-such-tool"));
        assert!(missing.is_err());
        assert!(find_in_path("hako-bench-no-such-tool").is_none());
    }
}
