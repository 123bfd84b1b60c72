//! The review tools of a copy-on-write sandbox (`hako mcp --cow`):
//! `workspace_changes`, `checkpoint`, `list_checkpoints`, `rollback`, and,
//! only with `--allow-agent-commit`, `commit` and `discard`. Each records
//! what it did in the audit log (the same `review` record `hako commit`
//! writes, `front_end` `mcp`).
//!
//! Reading the changes and taking a checkpoint read the upper layer
//! while the sandbox runs. Rollback, commit and discard change the layers
//! or the workspace, which no mounted sandbox may see change under it: the
//! sandbox is closed first (every process and shell session in it ends),
//! the layers changed, and the next tool call opens a sandbox on them
//! again ([`State::with_sandbox_closed`]).

use std::path::PathBuf;

use hako_audit::FrontEnd;
use hako_runtime::cow::{commit_op, discard_op, Changes, ReviewError};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::CallToolResult;
use rmcp::{tool, tool_router};
use schemars::JsonSchema;
use serde::Deserialize;

use super::HakoServer;
use crate::state::{not_cow, Reply, State, ToolError};

/// The tools about a copy-on-write sandbox's changes.
pub(crate) const REVIEW_TOOLS: [&str; 4] = [
    "workspace_changes",
    "checkpoint",
    "list_checkpoints",
    "rollback",
];

/// The tools that change the real workspace or throw changes away: only
/// with `--allow-agent-commit`.
pub(crate) const COMMIT_TOOLS: [&str; 2] = ["commit", "discard"];

/// The most bytes of a `workspace_changes` reply.
const MAX_REPLY: usize = 256 << 10;

/// How a `workspace_changes` reply shows the changes.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangesFormat {
    /// The summary, then a unified diff like `git diff`.
    #[default]
    Diff,
    /// Only the summary: one line per change and the totals.
    Stat,
    /// JSON: the hash and one entry per change (path, status, both
    /// sides, lines added and removed, and why committing it is refused).
    Json,
}

/// Arguments of `workspace_changes`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangesArgs {
    /// Only these paths (and what is beneath them), relative to the
    /// workspace root. Default: every change.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Compare from this checkpoint (its number or label) instead of the
    /// workspace.
    pub from: Option<CheckpointRef>,
    /// Compare to this checkpoint instead of the sandbox as it is now.
    pub to: Option<CheckpointRef>,
    /// diff (default), stat or json.
    pub format: Option<ChangesFormat>,
}

/// A checkpoint: its number, or its label.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CheckpointRef {
    /// Its number, as `checkpoint` returned it.
    Number(u64),
    /// Its number as text, or its label (the latest of that label).
    Text(String),
}

impl CheckpointRef {
    fn text(&self) -> String {
        match self {
            CheckpointRef::Number(n) => n.to_string(),
            CheckpointRef::Text(t) => t.clone(),
        }
    }
}

/// Arguments of `checkpoint`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointArgs {
    /// A label to find it by (letters, digits, `.`, `_`, `-`; 1 to 64).
    pub label: Option<String>,
}

/// Arguments of `rollback`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackArgs {
    /// The checkpoint to return to: its number or its label.
    pub checkpoint: CheckpointRef,
}

/// Arguments of `commit`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitArgs {
    /// Only these paths (and what is beneath them), relative to the
    /// workspace root. Default: every change.
    #[serde(default)]
    pub paths: Vec<String>,
    /// Commit only if the changes hash to this (the hash
    /// workspace_changes gave): exactly what was reviewed.
    pub expect: Option<String>,
}

/// Arguments of `discard`.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiscardArgs {
    /// Only these paths (and what is beneath them), relative to the
    /// workspace root. Default: every change.
    #[serde(default)]
    pub paths: Vec<String>,
}

const WORKSPACE_CHANGES: &str = "Show what this copy-on-write sandbox changed compared with the real workspace (which it never writes): every file added, modified, deleted, a mode change or a symlink, whether a tool or a shell command made it. Read-only. `format`: diff (default: a summary, then a unified diff like `git diff`), stat (the summary only) or json (one entry per change). Always gives the changes' hash, which `commit` takes as `expect` to commit exactly what was reviewed. `paths` narrows it to those paths; `from`/`to` compare checkpoints instead (a number or a label). At most 256 KiB is returned: narrow it with `paths` or ask for stat when it says it was cut.";

const CHECKPOINT: &str = "Record the sandbox's changes as they are now as a checkpoint (an agent harness takes one per turn), to return to with rollback or compare with workspace_changes `from`/`to`. Returns its number; `label` names it too. Taken while the sandbox runs: a command still writing then may be caught part-way, so take it between commands.";

const LIST_CHECKPOINTS: &str = "List this sandbox's checkpoints: number, label and when each was taken (Unix milliseconds), oldest first.";

const ROLLBACK: &str = "Return the sandbox's view of the workspace to a checkpoint (its number or label): every change made since is lost unless it was checkpointed; the real workspace is not touched and the checkpoint is kept. To do it soundly the sandbox is closed first: every running command, process and shell session in it ends and their handles stop working; the next tool call opens the sandbox again, on the checkpoint's view.";

const COMMIT: &str = "Apply this sandbox's changes (all, or those at and beneath `paths`) to the real workspace, each file atomically, and only if they hash to `expect` when given (the hash workspace_changes showed). Refused, naming the path, for a file changed in the workspace since the sandbox was based on it, and for a device, FIFO, socket or set-user-ID file. The sandbox is closed first (every process and shell session in it ends) and opened again by the next call. Offered only because this server was started with --allow-agent-commit.";

const DISCARD: &str = "Throw away this sandbox's changes (all, or those at and beneath `paths`): it sees the real workspace there again; the workspace is not touched. The sandbox is closed first (every process and shell session in it ends) and opened again by the next call. Offered only because this server was started with --allow-agent-commit.";

/// The answer to `commit` or `discard` on a server started without
/// `--allow-agent-commit`.
pub(crate) fn commit_refused(state: &State) -> ToolError {
    let person = match state.cow().and_then(|c| c.name().map(str::to_owned)) {
        Some(name) => format!("the person reviews them (`hako diff {name}`) and commits with `hako commit {name}` (or throws them away with `hako discard {name}`)"),
        None => "the person commits them; this sandbox's layer is temporary (the server has no --name), so they are lost when the server stops unless you tell the person what to keep".to_owned(),
    };
    ToolError {
        message: format!(
            "refused: committing to the real workspace stays with the person, not the agent: {person}. This server was started without --allow-agent-commit, the flag that lets an agent commit or discard; workspace_changes shows what would be committed"
        ),
        refused: true,
        lost: None,
    }
}

impl From<ReviewError> for ToolError {
    fn from(err: ReviewError) -> Self {
        ToolError {
            refused: err.is_refusal(),
            message: err.to_string(),
            lost: None,
        }
    }
}

/// `text`, cut to [`MAX_REPLY`] bytes at a character boundary with a
/// note saying how to see the rest.
fn bounded(text: String) -> String {
    if text.len() <= MAX_REPLY {
        return text;
    }
    let mut end = MAX_REPLY;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n... cut: the reply is {} bytes, more than the {} KiB one carries; narrow it with `paths`, or ask for format stat (the hash at the top is of every change)",
        &text[..end],
        text.len(),
        MAX_REPLY >> 10
    )
}

fn show_changes(changes: &Changes, format: ChangesFormat) -> String {
    match format {
        ChangesFormat::Json => bounded(changes.json.to_string()),
        ChangesFormat::Stat | ChangesFormat::Diff => {
            let mut text = format!("# hash: {}\n", changes.hash);
            if changes.count == 0 {
                text.push_str("no changes\n");
                return text;
            }
            text.push_str(&changes.stat);
            if matches!(format, ChangesFormat::Diff) {
                text.push('\n');
                text.push_str(&changes.unified);
            }
            bounded(text)
        }
    }
}

fn paths(given: Vec<String>) -> Vec<PathBuf> {
    given.into_iter().map(PathBuf::from).collect()
}

impl HakoServer {
    /// Runs a review tool on the blocking pool: bounded like every call,
    /// its failure recorded, a panic an error result. It does not open
    /// the sandbox.
    async fn review<F>(&self, tool: &'static str, f: F) -> CallToolResult
    where
        F: FnOnce(&State) -> Result<Reply, ToolError> + Send + 'static,
    {
        self.on_blocking_pool(tool, move |state| {
            if state.cow().is_some() {
                f(state)
            } else {
                Err(not_cow())
            }
        })
        .await
    }
}

#[tool_router(router = review_router, vis = "pub(crate)")]
impl HakoServer {
    #[tool(
        name = "workspace_changes",
        description = WORKSPACE_CHANGES,
        annotations(title = "Show workspace changes", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn workspace_changes(&self, Parameters(args): Parameters<ChangesArgs>) -> CallToolResult {
        self.review("workspace_changes", move |state| {
            let cow = state.cow().ok_or_else(not_cow)?;
            let from = args.from.as_ref().map(CheckpointRef::text);
            let to = args.to.as_ref().map(CheckpointRef::text);
            let changes = cow.changes(&paths(args.paths), from.as_deref(), to.as_deref())?;
            Ok(show_changes(&changes, args.format.unwrap_or_default()).into())
        })
        .await
    }

    #[tool(
        name = "checkpoint",
        description = CHECKPOINT,
        annotations(title = "Take a checkpoint", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn checkpoint(&self, Parameters(args): Parameters<CheckpointArgs>) -> CallToolResult {
        self.review("checkpoint", move |state| {
            let cow = state.cow().ok_or_else(not_cow)?;
            let cp = cow.checkpoint(args.label.as_deref())?;
            let label = cp
                .label
                .as_deref()
                .map(|l| format!(" (label {l})"))
                .unwrap_or_default();
            Ok(format!(
                "checkpoint {}{label} taken; return to it with rollback {{\"checkpoint\": {}}}",
                cp.id, cp.id
            )
            .into())
        })
        .await
    }

    #[tool(
        name = "list_checkpoints",
        description = LIST_CHECKPOINTS,
        annotations(title = "List checkpoints", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_checkpoints(&self) -> CallToolResult {
        self.review("list_checkpoints", move |state| {
            let cow = state.cow().ok_or_else(not_cow)?;
            let all = cow.checkpoints()?;
            if all.is_empty() {
                return Ok("no checkpoints yet; checkpoint takes one".to_owned().into());
            }
            let lines: Vec<String> = all
                .iter()
                .map(|cp| {
                    format!(
                        "checkpoint {}\tlabel {}\tat_ms {}",
                        cp.id,
                        cp.label.as_deref().unwrap_or("-"),
                        cp.at_ms
                    )
                })
                .collect();
            Ok(lines.join("\n").into())
        })
        .await
    }

    #[tool(
        name = "rollback",
        description = ROLLBACK,
        annotations(title = "Roll back to a checkpoint", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn rollback(&self, Parameters(args): Parameters<RollbackArgs>) -> CallToolResult {
        self.review("rollback", move |state| {
            let which = args.checkpoint.text();
            let (cp, record) = state.with_sandbox_closed(|cow| {
                cow.rollback(&which).map(|cp| {
                    let op = hako_audit::ReviewOp::Rollback { checkpoint: cp.id };
                    (cp, cow.record(FrontEnd::Mcp, None, op))
                })
            })??;
            state.record(record);
            Ok(format!(
                "rolled back to checkpoint {}: every change made since is gone from the sandbox's view (the workspace was not touched). The sandbox was closed to do it: every command, process and shell session in it ended and their handles no longer work; the next call opens it again on the checkpoint's view",
                cp.id
            )
            .into())
        })
        .await
    }

    #[tool(
        name = "commit",
        description = COMMIT,
        annotations(title = "Commit changes to the workspace", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn commit(&self, Parameters(args): Parameters<CommitArgs>) -> CallToolResult {
        self.review("commit", move |state| {
            if !state.allow_commit() {
                return Err(commit_refused(state));
            }
            let (result, record) = state.with_sandbox_closed(|cow| {
                let result = cow.commit(&paths(args.paths), args.expect.as_deref());
                let record = commit_op(&result).map(|op| cow.record(FrontEnd::Mcp, None, op));
                (result, record)
            })?;
            // What was written is recorded, whatever the outcome.
            if let Some(record) = record {
                state.record(record);
            }
            let report = result?;
            let mut text = String::new();
            for a in &report.applied {
                let status = serde_json::to_value(a.status)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                match &a.sha256 {
                    Some(sha) => text.push_str(&format!("{status} {} sha256:{sha}\n", a.path)),
                    None => text.push_str(&format!("{status} {}\n", a.path)),
                }
            }
            text.push_str(&format!(
                "# hash: {}\ncommitted {} change(s) to the workspace; the sandbox was closed to do it (its processes and sessions ended) and the next call opens it again",
                report.hash,
                report.applied.len()
            ));
            Ok(bounded(text).into())
        })
        .await
    }

    #[tool(
        name = "discard",
        description = DISCARD,
        annotations(title = "Discard changes", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn discard(&self, Parameters(args): Parameters<DiscardArgs>) -> CallToolResult {
        self.review("discard", move |state| {
            if !state.allow_commit() {
                return Err(commit_refused(state));
            }
            let (removed, record) = state.with_sandbox_closed(|cow| {
                cow.discard(&paths(args.paths)).map(|removed| {
                    let record = cow.record(FrontEnd::Mcp, None, discard_op(&removed));
                    (removed, record)
                })
            })??;
            state.record(record);
            let mut text: String = removed
                .iter()
                .map(|p| format!("discarded {}\n", p.display()))
                .collect();
            text.push_str("the sandbox was closed to do it (its processes and sessions ended) and the next call opens it again");
            Ok(bounded(text).into())
        })
        .await
    }
}
