//! A deliberately naive backend, to prove that the cases can fail.
//!
//! It checks paths the way a first attempt does: lexically, then
//! `canonicalize` and compare the prefix, then use the path string (the
//! check-then-use window); it follows dangling symlinks when creating,
//! appends through hard links, opens FIFOs blocking, runs commands with the
//! host's environment and descriptors, and ignores `close()`. The kit must
//! fail it where it is wrong and pass it where it is right.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use hako_core::{
    AppendFile, Capabilities, Command, DirEntry, DirListing, Error, ExitStatus, FenceError,
    FenceResolver, FileKind, Isolation, NetworkAccess, Optional, Output, ReadLimit, ReadOutcome,
    Result, Sandbox, Workdir,
};

use crate::check::host_kind;
use crate::{cases, factory, run_case, Outcome};

struct Naive {
    ws: PathBuf,
    caps: Capabilities,
}

fn io(path: &Path, e: std::io::Error) -> Error {
    Error::Fence(match e.kind() {
        std::io::ErrorKind::NotFound => FenceError::NotFound { path: path.into() },
        _ => FenceError::Io {
            op: "naive",
            path: path.into(),
            source: e,
        },
    })
}

impl Naive {
    fn new(ws: &Path) -> Naive {
        Naive {
            ws: ws.to_path_buf(),
            caps: Capabilities {
                backend: "naive".into(),
                isolation: Isolation::None,
                network: NetworkAccess::Host,
                fence: FenceResolver::ComponentWalk,
                limits: Vec::new(),
                env_sanitised: false,
                fds_closed: false,
                landlock_abi: None,
                accelerator: None,
                seccomp: false,
                shared: hako_core::Shared::ALL.to_vec(),
                defects: Vec::new(),
                optional: Optional {
                    read_limit: true,
                    append: true,
                    workdir: true,
                    ..Optional::default()
                },
            },
        }
    }

    /// Check, then use: the checked path is resolved again when used.
    fn full(&self, path: &Path) -> Result<PathBuf> {
        let rel = hako_core::path::relative(path, &self.ws)?;
        let full = self.ws.join(rel);
        match std::fs::canonicalize(&full) {
            Ok(c) if c.starts_with(&self.ws) => Ok(full),
            Ok(_) => Err(FenceError::SymlinkEscape { path: path.into() }.into()),
            // Nothing there yet: fine to create (through a dangling link too).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(full),
            Err(e) => Err(io(path, e)),
        }
    }
}

impl Sandbox for Naive {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    fn exec(&self, command: &Command) -> Result<Output> {
        let argv = command.program.argv();
        let cwd = self.full(command.cwd.as_deref().unwrap_or(Path::new(".")))?;
        let mut child = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .current_dir(cwd)
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

    fn read_limit(&self) -> Option<&dyn ReadLimit> {
        Some(self)
    }

    fn append(&self) -> Option<&dyn AppendFile> {
        Some(self)
    }

    fn workdir(&self) -> Option<&dyn Workdir> {
        Some(self)
    }
}

impl ReadLimit for Naive {
    fn read_file_limit(&self, path: &Path, max: u64) -> Result<ReadOutcome> {
        let file = std::fs::File::open(self.full(path)?).map_err(|e| io(path, e))?;
        let mut data = Vec::new();
        file.take(max.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| io(path, e))?;
        let truncated = data.len() as u64 > max;
        data.truncate(usize::try_from(max).unwrap_or(usize::MAX));
        Ok(ReadOutcome { data, truncated })
    }
}

impl AppendFile for Naive {
    fn append_file(&self, path: &Path, data: &[u8]) -> Result<()> {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.full(path)?)
            .and_then(|mut f| f.write_all(data))
            .map_err(|e| io(path, e))
    }
}

impl Workdir for Naive {
    fn workdir(&self) -> &Path {
        &self.ws
    }
}

fn naive() -> std::sync::Arc<crate::Factory> {
    factory(|ws: &Path| Ok(Box::new(Naive::new(ws))))
}

#[test]
fn the_kit_fails_a_check_then_use_backend_where_it_is_wrong() {
    for name in [
        "symlink_swapped_during_write_and_read_is_refused",
        "final_component_swapped_for_a_symlink_is_never_followed",
        "dangling_symlink_never_creates_its_target",
        "hardlink_to_an_outside_file_is_never_written_through",
        "reading_a_fifo_is_refused_without_blocking",
        "host_secrets_do_not_reach_the_command",
        "only_stdin_stdout_and_stderr_reach_the_command",
        "closed_sandbox_refuses_every_operation",
        "symlink_to_outside_is_refused_by_every_operation",
        "symlink_to_outside_in_an_intermediate_component_is_refused",
    ] {
        // The race cases catch the naive backend only when a swap lands in
        // its window: on a loaded machine 10 000 iterations can miss it, so
        // each gets three tries (a backend that is right is never caught).
        let mut last = None;
        for _ in 0..3 {
            match run_case(name, naive()) {
                Outcome::Failed(message) => {
                    eprintln!("naive backend, {name}: failed as it must: {message}");
                    last = None;
                    break;
                }
                other => last = Some(other),
            }
        }
        if let Some(other) = last {
            panic!("{name} did not fail the naive backend in three tries: {other:?}");
        }
    }
}

#[test]
fn the_kit_passes_a_check_then_use_backend_where_it_is_right() {
    for name in [
        "exit_codes_are_reported_exactly",
        "stdout_and_stderr_are_kept_apart",
        "dot_dot_escape_is_refused_by_every_operation",
        "nul_byte_in_a_path_is_refused",
        "over_long_paths_and_components_are_refused",
    ] {
        assert!(cases().iter().any(|c| c.name == name), "{name}");
        assert_eq!(run_case(name, naive()), Outcome::Passed, "{name}");
    }
}
