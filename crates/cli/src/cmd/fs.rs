//! `hako fs`: file operations through the fence.

use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use hako_core::{DirEntry, Error, FileKind, Metadata, Sandbox};
use serde::Serialize;

use super::{BackendFlag, IsolationFlag};
use crate::exit;
use crate::show::{self, escaped};

/// Most bytes `write` and `append` take from standard input.
const MAX_INPUT: u64 = hako_fence::DEFAULT_MAX_READ;

/// The sandbox flags that apply to file operations: which sandbox, and
/// which workspace (a copy-on-write one's layers too). The flags that
/// shape commands (limits, network, environment, binds outside the
/// workspace, output caps) are not offered: no command runs. A profile's
/// keys for them are read and checked all the same, and shape the sandbox
/// opened, as with every front end.
#[derive(Debug, Clone, Args)]
pub struct FileSandboxArgs {
    /// Read sandbox settings from a TOML profile (the flags below are keys
    /// of the same name, `-` written `_`); flags given here win.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// Backend to use [default: auto].
    #[arg(long, value_enum)]
    backend: Option<BackendFlag>,
    /// Sandbox root [default: the current directory].
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Refuse unless the sandbox is at least this strong [default: none].
    #[arg(long, value_name = "LEVEL", value_enum)]
    min_isolation: Option<IsolationFlag>,
    /// Image: a name for --backend docker [default: hako-busybox:latest], a
    /// root directory for --backend gvisor [default: a read-only view of
    /// the host's system directories].
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// OCI runtime for --backend docker (e.g. runsc for gVisor, runc, crun).
    #[arg(long, value_name = "NAME")]
    runtime: Option<String>,
    /// --backend docker without the guest, for images where the static
    /// guest cannot run.
    #[arg(long)]
    no_guest: bool,
    /// Copy-on-write workspace: with --name, work in that named sandbox's
    /// layers (`hako diff NAME` shows what changed).
    #[arg(long)]
    cow: bool,
    /// The named copy-on-write sandbox whose layers to work in.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// Where named sandboxes are kept [default: $XDG_STATE_HOME/hako, else ~/.local/state/hako].
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
}

impl FileSandboxArgs {
    fn plan(&self) -> Result<hako_runtime::Plan, String> {
        hako_runtime::SandboxFlags {
            profile: self.profile.clone(),
            backend: self.backend.map(|BackendFlag(b)| b),
            workspace: self.workspace.clone(),
            min_isolation: self.min_isolation.map(|IsolationFlag(level)| level),
            image: self.image.clone(),
            runtime: self.runtime.clone(),
            no_guest: self.no_guest,
            cow: self.cow,
            name: self.name.clone(),
            state: self.state.clone(),
            ..hako_runtime::SandboxFlags::default()
        }
        .plan()
    }
}

/// Flags of `hako fs`.
#[derive(Debug, Args)]
pub struct FsArgs {
    #[command(flatten)]
    sandbox: FileSandboxArgs,
    /// Print results as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    op: FsOp,
}

/// One file operation.
#[derive(Debug, Subcommand)]
enum FsOp {
    /// Print a file's contents.
    Read {
        /// Path relative to the workspace.
        path: PathBuf,
        /// Read at most N bytes (says so on stderr when the file is longer).
        #[arg(long, value_name = "N")]
        max_bytes: Option<u64>,
    },
    /// Replace a file with standard input, atomically (missing parent
    /// directories are created).
    Write {
        /// Path relative to the workspace.
        path: PathBuf,
    },
    /// Replace exact text in a file, atomically; refused (nothing written)
    /// when the file changed between its read and the write.
    Edit {
        /// Path relative to the workspace.
        path: PathBuf,
        /// The exact text to replace; it must occur once unless --all.
        #[arg(long, value_name = "TEXT")]
        old: String,
        /// The text to put in its place.
        #[arg(long, value_name = "TEXT")]
        new: String,
        /// Replace every occurrence.
        #[arg(long)]
        all: bool,
    },
    /// Append standard input to a file, creating it if missing.
    Append {
        /// Path relative to the workspace.
        path: PathBuf,
    },
    /// List a directory (symlinks shown as symlinks).
    Ls {
        /// Path relative to the workspace.
        #[arg(default_value = ".")]
        path: PathBuf,
    },
    /// Remove a file, a symlink or an empty directory (never recursive).
    Rm {
        /// Path relative to the workspace.
        path: PathBuf,
    },
    /// Create a directory and its missing parents.
    Mkdir {
        /// Path relative to the workspace.
        path: PathBuf,
    },
    /// Show a path's own metadata.
    Stat {
        /// Path relative to the workspace.
        path: PathBuf,
    },
}

fn unsupported(sandbox: &dyn Sandbox, capability: &'static str) -> Error {
    Error::Unsupported {
        backend: sandbox.capabilities().backend.clone(),
        capability,
    }
}

fn read_input() -> Result<Vec<u8>, String> {
    let mut data = Vec::new();
    std::io::stdin()
        .take(MAX_INPUT + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read standard input: {e}"))?;
    if data.len() as u64 > MAX_INPUT {
        return Err(format!(
            "standard input is larger than {MAX_INPUT} bytes; nothing was written"
        ));
    }
    Ok(data)
}

fn kind_char(kind: FileKind) -> char {
    match kind {
        FileKind::File => '-',
        FileKind::Dir => 'd',
        FileKind::Symlink => 'l',
        FileKind::Fifo => 'p',
        FileKind::Socket => 's',
        FileKind::CharDevice => 'c',
        FileKind::BlockDevice => 'b',
        FileKind::Unknown => '?',
    }
}

#[derive(Serialize)]
struct JsonEntry {
    name: String,
    kind: FileKind,
    size: u64,
    mode: String,
    mtime: i64,
}

impl From<&DirEntry> for JsonEntry {
    fn from(e: &DirEntry) -> Self {
        JsonEntry {
            name: e.name.to_string_lossy().into_owned(),
            kind: e.kind,
            size: e.size,
            mode: format!("{:04o}", e.mode),
            mtime: e.mtime,
        }
    }
}

#[derive(Serialize)]
struct JsonStat {
    kind: FileKind,
    size: u64,
    mode: String,
    mtime: i64,
    links: u64,
    symlink_target: Option<String>,
}

impl From<&Metadata> for JsonStat {
    fn from(m: &Metadata) -> Self {
        JsonStat {
            kind: m.kind,
            size: m.size,
            mode: format!("{:04o}", m.mode),
            mtime: m.mtime,
            links: m.links,
            symlink_target: m
                .symlink_target
                .as_ref()
                .map(|t| t.to_string_lossy().into_owned()),
        }
    }
}

fn print_json(value: &impl Serialize) {
    println!("{}", serde_json::to_string(value).unwrap_or_default());
}

/// Runs `hako fs`.
pub fn run(args: FsArgs) -> u8 {
    // With --cow (and a name), the named sandbox's layered view.
    let opened = args.sandbox.plan().and_then(|plan| {
        if plan.cow.as_ref().is_some_and(|c| c.name.is_none()) {
            eprintln!("hako: warning: --cow without --name is a temporary layer, removed when this command ends: what it writes is lost (name the sandbox to work in its layers)");
        }
        hako_runtime::Opener::from_plan(plan, hako_core::Isolation::None)
            .and_then(|opener| opener.open())
            .map_err(|e| e.to_string())
    });
    let sandbox = match opened {
        Ok(sb) => sb,
        Err(e) => {
            eprintln!("hako: {}", show::message(&e));
            return exit::SANDBOX_FAILED;
        }
    };
    let result = operate(sandbox.as_ref(), &args.op, args.json);
    let _ = sandbox.close();
    match result {
        Ok(()) => 0,
        Err(message) => {
            if args.json {
                print_json(&serde_json::json!({ "error": message }));
            }
            // The message may name a path from inside, or carry the guest's.
            eprintln!("hako: {}", show::message(&message));
            exit::FS_FAILED
        }
    }
}

fn operate(sandbox: &dyn Sandbox, op: &FsOp, json: bool) -> Result<(), String> {
    let err = |e: Error| e.to_string();
    match op {
        FsOp::Read { path, max_bytes } => {
            let (data, truncated) = match max_bytes {
                Some(max) => {
                    let reader = sandbox
                        .read_limit()
                        .ok_or_else(|| unsupported(sandbox, "bounded reads"))
                        .map_err(err)?;
                    let outcome = reader.read_file_limit(path, *max).map_err(err)?;
                    (outcome.data, outcome.truncated)
                }
                None => (sandbox.read_file(path).map_err(err)?, false),
            };
            if json {
                print_json(&serde_json::json!({
                    "path": path,
                    "content": String::from_utf8_lossy(&data),
                    "bytes": data.len(),
                    "truncated": truncated,
                }));
            } else {
                let mut out = std::io::stdout().lock();
                out.write_all(&data)
                    .and_then(|()| out.flush())
                    .map_err(|e| format!("cannot write to standard output: {e}"))?;
                if truncated {
                    eprintln!(
                        "hako: {} truncated at {} bytes (--max-bytes)",
                        escaped(path.as_os_str().as_bytes()),
                        data.len()
                    );
                }
            }
        }
        FsOp::Write { path } => {
            let data = read_input()?;
            // As MCP's write_file and the HTTP API's PUT /files do.
            let created_dirs = hako_core::write_file_creating_parents(sandbox, path, &data)
                .map_err(err)?
                .is_some();
            if json {
                print_json(&serde_json::json!({
                    "path": path,
                    "bytes": data.len(),
                    "created_dirs": created_dirs,
                }));
            }
        }
        FsOp::Edit {
            path,
            old,
            new,
            all,
        } => {
            let shown = escaped(path.as_os_str().as_bytes()).to_string();
            let outcome = match sandbox.read_limit() {
                Some(r) => r.read_file_limit(path, MAX_INPUT).map_err(err)?,
                None => hako_core::ReadOutcome {
                    data: sandbox.read_file(path).map_err(err)?,
                    truncated: false,
                },
            };
            if outcome.truncated {
                return Err(format!(
                    "{shown} is larger than {MAX_INPUT} bytes; nothing was written"
                ));
            }
            let before = std::str::from_utf8(&outcome.data)
                .map_err(|_| format!("{shown} is not UTF-8 text; nothing was written"))?;
            let cap = usize::try_from(MAX_INPUT).unwrap_or(usize::MAX);
            let (after, count) = hako_mcp::replace_exact(before, old, new, *all, cap)
                .map_err(|e| e.message(&shown))?;
            // Only if the file still holds what the edit was made from.
            hako_core::replace_if_unchanged(sandbox, path, after.as_bytes(), &outcome.data)
                .map_err(err)?;
            if json {
                print_json(&serde_json::json!({ "path": path, "replacements": count }));
            }
        }
        FsOp::Append { path } => {
            let data = read_input()?;
            let appender = sandbox
                .append()
                .ok_or_else(|| unsupported(sandbox, "append"))
                .map_err(err)?;
            appender.append_file(path, &data).map_err(err)?;
            if json {
                print_json(&serde_json::json!({ "path": path, "bytes": data.len() }));
            }
        }
        FsOp::Ls { path } => {
            let listing = sandbox.list_dir(path).map_err(err)?;
            if json {
                let entries: Vec<JsonEntry> = listing.entries.iter().map(Into::into).collect();
                print_json(&serde_json::json!({
                    "path": path,
                    "entries": entries,
                    "truncated": listing.truncated,
                }));
            } else {
                let mut out = std::io::stdout().lock();
                for e in &listing.entries {
                    // The name is chosen inside: escaped, it can neither
                    // drive the terminal nor forge a line.
                    writeln!(
                        out,
                        "{}{:04o} {:>12} {}{}",
                        kind_char(e.kind),
                        e.mode,
                        e.size,
                        escaped(e.name.as_bytes()),
                        if e.kind == FileKind::Dir { "/" } else { "" }
                    )
                    .map_err(|e| format!("cannot write to standard output: {e}"))?;
                }
                if listing.truncated {
                    eprintln!(
                        "hako: listing truncated at {} entries",
                        listing.entries.len()
                    );
                }
            }
        }
        FsOp::Rm { path } => sandbox.remove(path).map_err(err)?,
        FsOp::Mkdir { path } => {
            let maker = sandbox
                .make_dir_all()
                .ok_or_else(|| unsupported(sandbox, "make-dir-all"))
                .map_err(err)?;
            maker.make_dir_all(path).map_err(err)?;
        }
        FsOp::Stat { path } => {
            let stat = sandbox
                .stat()
                .ok_or_else(|| unsupported(sandbox, "stat"))
                .map_err(err)?
                .stat(path)
                .map_err(err)?;
            if json {
                print_json(&JsonStat::from(&stat));
            } else {
                print!(
                    "kind: {}\nsize: {}\nmode: {:04o}\nmtime: {}\nlinks: {}\n",
                    stat.kind, stat.size, stat.mode, stat.mtime, stat.links
                );
                if let Some(target) = &stat.symlink_target {
                    println!("target: {}", escaped(target.as_os_str().as_bytes()));
                }
            }
        }
    }
    Ok(())
}
