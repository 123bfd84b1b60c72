//! Broken twins of a copy-on-write backend, to prove that the cases can
//! fail, and fail where the twin is wrong.
//!
//! - `forgetful` forgets the layers: its commands and its file API work
//!   on the workspace itself. Every case must fail it.
//! - `lower_file_api` runs each command in a real overlay of the layers
//!   (a user and mount namespace of its own, `unshare`), but its file API
//!   reads and writes the workspace, the lower layer, and its commands
//!   see the whole host beside the workspace. The kit must fail it where
//!   that shows (the file API, the state directory reachable, the
//!   outside deleted or written by commands) and pass it elsewhere.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use hako_core::{
    Capabilities, Command, CowLayers, DirEntry, DirListing, Error, ExitStatus, FenceError,
    FenceResolver, FileKind, Isolation, NetworkAccess, Optional, Output, Result, Sandbox,
};

use super::{cow_cases, cow_factory, run_cow_case, CowFactory};
use crate::check::host_kind;
use crate::Outcome;

struct NaiveCow {
    ws: PathBuf,
    layers: Option<CowLayers>,
    caps: Capabilities,
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Fence(match e.kind() {
        std::io::ErrorKind::NotFound => FenceError::NotFound { path: path.into() },
        _ => FenceError::Io {
            op: "naive cow",
            path: path.into(),
            source: e,
        },
    })
}

/// Mounts the overlay on the workspace (`$1`), then runs the command in
/// it.
const IN_OVERLAY: &str = r#"mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3,userxattr" "$1" || exit 125
cd "$1/$4" || exit 126
shift 4
exec "$@""#;

impl NaiveCow {
    fn new(ws: &Path, layers: Option<CowLayers>) -> NaiveCow {
        NaiveCow {
            ws: ws.to_path_buf(),
            layers,
            caps: Capabilities {
                backend: "naive-cow".into(),
                isolation: Isolation::None,
                network: NetworkAccess::Host,
                fence: FenceResolver::ComponentWalk,
                limits: Vec::new(),
                env_sanitised: false,
                fds_closed: false,
                landlock_abi: None,
                accelerator: None,
                seccomp: false,
                shared: Vec::new(),
                defects: Vec::new(),
                optional: Optional::default(),
            },
        }
    }

    /// Lexically inside the workspace, nothing more (a naive fence).
    fn full(&self, path: &Path) -> Result<PathBuf> {
        let rel = hako_core::path::relative(path, &self.ws)?;
        Ok(self.ws.join(rel))
    }
}

impl Sandbox for NaiveCow {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn exec(&self, command: &Command) -> Result<Output> {
        let argv = command.program.argv();
        let cwd = command.cwd.clone().unwrap_or_else(|| PathBuf::from("."));
        let mut child = match &self.layers {
            None => {
                let mut c = std::process::Command::new(&argv[0]);
                c.args(&argv[1..]).current_dir(self.full(&cwd)?);
                c
            }
            Some(layers) => {
                let mut c = std::process::Command::new("unshare");
                c.args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
                    .arg(IN_OVERLAY)
                    .arg("sh")
                    .arg(&self.ws)
                    .arg(&layers.upper)
                    .arg(&layers.work)
                    .arg(&cwd)
                    .args(&argv);
                c
            }
        };
        let mut child = child
            .envs(command.env.iter().cloned())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Io {
                op: "spawn",
                source: e,
            })?;
        let mut stdin = child.stdin.take().unwrap();
        let data = command.stdin.clone().unwrap_or_default();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let out = child.wait_with_output().map_err(|e| Error::Io {
            op: "wait",
            source: e,
        })?;
        let _ = writer.join();
        use std::os::unix::process::ExitStatusExt;
        Ok(Output {
            status: match out.status.code() {
                Some(code) => ExitStatus::Code(code),
                None => ExitStatus::Signal(out.status.signal().unwrap_or(0)),
            },
            stdout_total: out.stdout.len() as u64,
            stderr_total: out.stderr.len() as u64,
            stdout: out.stdout,
            stderr: out.stderr,
            stdout_truncated: false,
            stderr_truncated: false,
            duration: std::time::Duration::ZERO,
            timed_out: false,
            oom_killed: false,
        })
    }

    fn read_file(&self, path: &Path) -> Result<Vec<u8>> {
        std::fs::read(self.full(path)?).map_err(|e| io(path, e))
    }

    fn write_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        std::fs::write(self.full(path)?, data).map_err(|e| io(path, e))
    }

    fn remove(&self, path: &Path) -> Result<()> {
        let full = self.full(path)?;
        std::fs::remove_file(&full)
            .or_else(|_| std::fs::remove_dir(&full))
            .map_err(|e| io(path, e))
    }

    fn list_dir(&self, path: &Path) -> Result<DirListing> {
        let mut entries = Vec::new();
        for entry in std::fs::read_dir(self.full(path)?).map_err(|e| io(path, e))? {
            let entry = entry.map_err(|e| io(path, e))?;
            entries.push(DirEntry {
                name: entry.file_name(),
                kind: host_kind(&entry.path()).unwrap_or(FileKind::Unknown),
                size: 0,
                mode: 0,
                mtime: 0,
            });
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(DirListing {
            entries,
            truncated: false,
        })
    }

    fn close(&self) -> Result<()> {
        Ok(())
    }
}

fn forgetful() -> std::sync::Arc<CowFactory> {
    cow_factory(|ws: &Path, _layers: CowLayers| Ok(Box::new(NaiveCow::new(ws, None))))
}

fn lower_file_api() -> std::sync::Arc<CowFactory> {
    cow_factory(|ws: &Path, layers: CowLayers| Ok(Box::new(NaiveCow::new(ws, Some(layers)))))
}

/// Whether an unprivileged overlay can be mounted here (`unshare`).
fn overlay_works() -> bool {
    let Ok(dir) = tempfile::tempdir() else {
        return false;
    };
    for sub in ["l", "u", "w"] {
        if std::fs::create_dir(dir.path().join(sub)).is_err() {
            return false;
        }
    }
    let p = |s: &str| dir.path().join(s).display().to_string();
    std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "--", "sh", "-c"])
        .arg(IN_OVERLAY)
        .args(["sh", &p("l"), &p("u"), &p("w"), ".", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Every case against `make`, all at once (each in a world of its own).
fn run_all(make: std::sync::Arc<CowFactory>) -> Vec<(&'static super::CowCase, Outcome)> {
    std::thread::scope(|scope| {
        let running: Vec<_> = cow_cases()
            .iter()
            .map(|case| {
                let make = make.clone();
                (
                    case,
                    scope.spawn(move || run_cow_case(case.name, make.as_ref())),
                )
            })
            .collect();
        running
            .into_iter()
            .map(|(case, handle)| (case, handle.join().unwrap()))
            .collect()
    })
}

#[test]
fn the_cow_kit_fails_a_backend_that_forgets_the_layers_in_every_case() {
    for (case, outcome) in run_all(forgetful()) {
        match outcome {
            Outcome::Failed(message) => {
                eprintln!(
                    "forgetful twin, {}: failed as it must: {message}",
                    case.name
                )
            }
            other => panic!("{} did not fail the forgetful twin: {other:?}", case.name),
        }
    }
}

/// Where `lower_file_api` is wrong.
const WRONG_IN_LOWER_FILE_API: &[&str] = &[
    // Its file API writes the workspace.
    "the_file_api_reads_and_writes_the_layered_view_and_agrees_with_commands",
    // Its commands see the host: the state directory by its path, the
    // outside through a symlink or `..`.
    "the_upper_layer_and_state_directory_are_not_reachable_from_inside_but_through_the_view",
    "a_symlink_in_the_layer_pointing_outside_is_committed_as_a_symlink_and_never_followed",
    "a_whiteout_or_opaque_dir_cannot_delete_anything_outside_the_workspace",
];

#[test]
fn the_cow_kit_fails_a_layered_backend_with_a_lower_file_api_only_where_it_is_wrong() {
    if !overlay_works() {
        assert!(
            !crate::must_work(),
            "an unprivileged overlay cannot be mounted here (unshare)"
        );
        eprintln!("SKIPPED: an unprivileged overlay cannot be mounted here (unshare)");
        return;
    }
    for (case, outcome) in run_all(lower_file_api()) {
        if WRONG_IN_LOWER_FILE_API.contains(&case.name) {
            match outcome {
                Outcome::Failed(message) => {
                    eprintln!(
                        "lower-file-API twin, {}: failed as it must: {message}",
                        case.name
                    )
                }
                other => panic!(
                    "{} did not fail the lower-file-API twin: {other:?}",
                    case.name
                ),
            }
        } else {
            assert_eq!(outcome, Outcome::Passed, "{}", case.name);
        }
    }
}
