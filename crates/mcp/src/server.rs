//! The MCP tools: their names, input schemas, descriptions and
//! annotations, each a thin translation into a blocking call on the
//! sandbox (run on tokio's blocking pool).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hako_core::{Sandbox, Stream};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;

mod review;

use crate::exec::{self, RunRequest};
use crate::files::{self, GrepArgs};
use crate::state::{Owner, Reply, State, ToolError};
use crate::text::shorten;

/// Longest quote of a deserialization error shown for invalid arguments.
const DETAIL_CHARS: usize = 300;

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The file, relative to the workspace root (an absolute path is
    /// accepted only when it lies inside the workspace).
    pub path: String,
    /// The first line to show, counting from 1. Default 1.
    pub offset: Option<u64>,
    /// How many lines to show. Default 2000.
    pub limit: Option<u64>,
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The file, relative to the workspace root. Missing parent
    /// directories are created.
    pub path: String,
    /// The whole new content of the file.
    pub content: String,
}

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EditFileArgs {
    /// The file, relative to the workspace root.
    pub path: String,
    /// The exact text to replace, whitespace and indentation included. It
    /// must occur exactly once unless replace_all is true.
    pub old_string: String,
    /// The text to put in its place.
    pub new_string: String,
    /// Replace every occurrence instead of requiring exactly one. Default
    /// false.
    #[serde(default)]
    pub replace_all: bool,
}

/// Arguments of `list_dir`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDirArgs {
    /// The directory, relative to the workspace root. Default: the root.
    pub path: Option<String>,
}

/// Arguments of `glob`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GlobArgs {
    /// A glob: `*` matches within one path component, `**` across
    /// directories, `?` one character, `{a,b}` either. A pattern without `/`
    /// matches file names at any depth (`*.rs`); one with `/` matches the
    /// path below `path` (`src/**/*.rs`).
    pub pattern: String,
    /// The directory to search, relative to the workspace root. Default:
    /// the root.
    pub path: Option<String>,
}

/// Arguments of `grep`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrepToolArgs {
    /// A regular expression (Rust regex syntax, like ripgrep's), matched
    /// against each line.
    pub pattern: String,
    /// A file or directory to search, relative to the workspace root.
    /// Default: the root.
    pub path: Option<String>,
    /// Only search files matching this glob (as in the glob tool, e.g.
    /// `*.py` or `src/**/*.rs`).
    pub glob: Option<String>,
    /// Ignore case. Default false.
    #[serde(default)]
    pub case_insensitive: bool,
    /// Most matching lines to return. Default 100, at most 1000.
    pub max_results: Option<u64>,
}

/// Arguments of `run_command`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// A shell command line, run with `sh -c` inside the sandbox.
    pub command: String,
    /// The directory to run it in, relative to the workspace root. Default:
    /// the root. Not allowed with session (use `cd` in the session).
    pub cwd: Option<String>,
    /// The command's deadline in seconds: when it passes, the command and
    /// everything it started are killed. Default 120, at most 86400.
    pub timeout_secs: Option<u64>,
    /// How long this call waits for the command, in seconds. If the
    /// command is still running then, the call returns a process handle
    /// and the output so far, and the command keeps running (until its
    /// deadline). Default 30, at most 600. Ignored with session.
    pub wait_secs: Option<u64>,
    /// A session id from open_session: run the command in that session's
    /// shell, sharing its working directory, environment and variables.
    pub session: Option<u64>,
    /// Keep the command's stdin open so that send_input can write to it (a
    /// REPL, a server reading requests). Default false: stdin is empty.
    #[serde(default)]
    pub keep_stdin_open: bool,
}

/// Arguments of `close_session`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArgs {
    /// The session id open_session returned.
    pub session: u64,
}

/// Which output stream to read.
#[derive(Debug, Clone, Copy, Default, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StreamArg {
    /// Standard output.
    #[default]
    Stdout,
    /// Standard error.
    Stderr,
}

/// Arguments of `read_output`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadOutputArgs {
    /// The process handle run_command returned.
    pub process: u64,
    /// The byte offset to read from (the `next offset` of the previous
    /// read). Default 0: from the start of what is still buffered.
    pub offset: Option<u64>,
    /// Which stream: stdout (default) or stderr.
    pub stream: Option<StreamArg>,
    /// Wait up to this many seconds for output past offset when there is
    /// none yet. Default 0, at most 600.
    pub wait_secs: Option<u64>,
}

/// Arguments of `send_input`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendInputArgs {
    /// The process handle run_command returned (started with
    /// keep_stdin_open).
    pub process: u64,
    /// The text to write to its stdin (include the newline a line-reading
    /// program waits for).
    pub data: String,
    /// Close its stdin after writing (the program sees end of input).
    /// Default false.
    #[serde(default)]
    pub close_stdin: bool,
}

/// Arguments of `kill_process`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessArgs {
    /// The process handle run_command returned.
    pub process: u64,
}

const READ_FILE: &str = "Read a text file in the workspace. Returns its lines numbered like `cat -n` (number, tab, line), from line `offset` (1-based, default 1), at most `limit` lines (default 2000) and 256 KiB of output; lines longer than 2000 characters are cut. Says when more lines follow and which offset continues. Reads at most the first 4 MiB of a file (it says so when the file is larger). Binary files are not shown. Errors: a path outside the workspace, through a symlink that leads out, missing, or a directory.";

const WRITE_FILE: &str = "Create or replace a file in the workspace with `content` (the whole file). The write is atomic: a reader sees the old or the new content, never a mix, and a refused write changes nothing. Missing parent directories are created. Errors: a path outside the workspace or through a symlink that leads out, a directory in the way.";

const EDIT_FILE: &str = "Replace exact text in a file in the workspace: `old_string` must occur exactly once (whitespace and indentation included), or set `replace_all` to replace every occurrence. Errors say how many times it matched (0: not found, read the file again; N: include more surrounding lines to make it unique). Returns the edited lines. Text files up to 16 MiB; the write is atomic.";

const LIST_DIR: &str = "List a directory in the workspace (default: its root): one line per entry with its kind (file, dir, symlink, ...), size in bytes and name; directories end with `/`. Symlinks are shown as symlinks, not followed. At most 2000 entries.";

const GLOB: &str = "Find files in the workspace by glob, e.g. `*.rs` (a name at any depth) or `src/**/test_*.py` (a path below `path`). Returns paths relative to the workspace root, sorted, at most 1000. Skips what .gitignore and .ignore files exclude (each honoured whole or not at all: at most 256 KiB each, 5000 patterns in all; the result names any not honoured) and .git directories; symlinks are listed, never followed.";

const GREP: &str = "Search file contents in the workspace with a regular expression (Rust regex syntax, as in ripgrep). Returns `path:line:text` for each matching line (lines cut to 400 characters), at most `max_results` (default 100, at most 1000) and 64 KiB. `path` may be a directory (default: the root) or one file; `glob` filters file names. Skips .gitignore'd files (ignore files bounded as in glob), .git, binary files and symlinks; reads at most 4 MiB of each file.";

const RUN_COMMAND: &str = "Run a shell command (`sh -c`) inside the sandbox, in the workspace (or `cwd` below it). Returns the exit code, the duration, and stdout and stderr; each stream keeps its first 8 KiB and last 8 KiB, with a marker saying how many bytes were cut between them. `timeout_secs` (default 120) is the command's deadline: when it passes, it and everything it started are killed and the result says it timed out (running the same command again will time out again). `wait_secs` (default 30) is how long this call waits: if the command is still running then, you get a process handle and the output so far, and it keeps running; use read_output, send_input and kill_process with the handle. With `session` (from open_session) it runs in that session's shell, which keeps the working directory, environment and variables between commands; a session command is always waited for (up to its deadline). Outside a session, whatever the command leaves running in the background is killed when it ends; in a session, background jobs live until the session is closed. Stdin is empty unless keep_stdin_open.";

const OPEN_SESSION: &str = "Open a shell session inside the sandbox and return its id. Commands run with run_command and this `session` share the shell's working directory, exported environment, shell variables and functions, like one terminal (`cd src`, `export X=1`, `source venv/bin/activate` persist). Close it with close_session.";

const CLOSE_SESSION: &str = "Close a shell session: its shell and everything started in it are killed. Closing a session that has ended does nothing.";

const READ_OUTPUT: &str = "Read the output of a process that run_command returned a handle for: up to 64 KiB of its stdout (or stderr, with `stream`) from byte `offset` (default 0), waiting up to `wait_secs` (default 0) for output when there is none yet. Says whether it is still running or how it ended, and the offset to read on from. A process keeps its last 1 MiB of stdout; older bytes are reported as dropped.";

const SEND_INPUT: &str = "Write text to the stdin of a process that run_command started with keep_stdin_open (include the newline a line-reading program waits for); `close_stdin` ends its input. Errors for a process without open stdin or one that has ended.";

const KILL_PROCESS: &str = "Kill a process that run_command returned a handle for, and everything it started. Killing one that has ended does nothing. Returns how it ended.";

const LIST_PROCESSES: &str = "List the processes run_command handed out handles for in this session, and any of this session's still running: handle, state (running, exit code, timed out), bytes of output, command. Handles (of processes and of shell sessions) work only in the session that got them.";

/// The server's instructions to the client.
const INSTRUCTIONS: &str = "Every tool acts inside a hako sandbox: a workspace directory and commands run behind its boundary. Paths are relative to the workspace root and cannot leave it. Use read_file, write_file and edit_file for files, list_dir, glob and grep to find things, run_command for commands (open_session for state kept between commands), and read_output, send_input, kill_process and list_processes for commands that outlive a call.";

/// What the instructions add for a copy-on-write sandbox.
const COW_INSTRUCTIONS: &str = "The workspace is copy-on-write: every change (through a tool or a command) lands in a private layer and the real workspace is untouched; workspace_changes shows them, checkpoint records them and rollback returns to a checkpoint.";

/// The MCP server over one sandbox.
#[derive(Clone)]
pub struct HakoServer {
    state: Arc<State>,
    /// The processes and shell sessions this client started: one server
    /// per client (per MCP session over HTTP), so handles stay with the
    /// client that got them.
    owner: Arc<Owner>,
    tool_router: ToolRouter<HakoServer>,
}

impl HakoServer {
    /// Runs `f` with the sandbox (opened now on first use) on the blocking
    /// pool (see [`HakoServer::on_blocking_pool`]); a failure that lost the
    /// sandbox closes it for good.
    async fn blocking<F>(&self, tool: &'static str, f: F) -> CallToolResult
    where
        F: FnOnce(&State, &dyn Sandbox) -> Result<Reply, ToolError> + Send + 'static,
    {
        self.on_blocking_pool(tool, move |state| {
            state.sandbox().and_then(|sandbox| {
                let result = f(state, sandbox.as_ref());
                if let Err(err) = &result {
                    state.sandbox_lost(&sandbox, err);
                }
                result
            })
        })
        .await
    }

    /// Runs `f` on the blocking pool, and turns its result, or its
    /// failure, into a tool result: bounded (past the bound a call is
    /// refused at once, never queued); a failure is a tool error result,
    /// recorded in the audit log; a panic in a tool is one too, and the
    /// server goes on.
    pub(crate) async fn on_blocking_pool<F>(&self, tool: &'static str, f: F) -> CallToolResult
    where
        F: FnOnce(&State) -> Result<Reply, ToolError> + Send + 'static,
    {
        let state = self.state.clone();
        let call = match state.begin_call() {
            Ok(call) => call,
            Err(err) => {
                state.record_failure(tool, &err);
                return CallToolResult::error(vec![ContentBlock::text(err.message)]);
            }
        };
        let joined = tokio::task::spawn_blocking(move || {
            let _call = call;
            let result = f(&state);
            if let Err(err) = &result {
                tracing::debug!(tool, error = %err.message, "tool failed");
                state.record_failure(tool, err);
            }
            result
        })
        .await;
        match joined {
            Ok(Ok(reply)) => {
                let content = vec![ContentBlock::text(reply.text)];
                if reply.is_error {
                    CallToolResult::error(content)
                } else {
                    CallToolResult::success(content)
                }
            }
            Ok(Err(err)) => CallToolResult::error(vec![ContentBlock::text(err.message)]),
            Err(join) => {
                tracing::error!(tool, "tool task failed: {join}");
                CallToolResult::error(vec![ContentBlock::text(format!(
                    "internal error in {tool}: {join}; the server is still running"
                ))])
            }
        }
    }
}

fn secs(value: Option<u64>, default: u64, max: u64, name: &str) -> Result<Duration, ToolError> {
    let v = value.unwrap_or(default);
    if v > max {
        return Err(ToolError::new(format!(
            "{name} is {v}; the most allowed is {max}"
        )));
    }
    Ok(Duration::from_secs(v))
}

#[tool_router]
impl HakoServer {
    /// A server whose sandbox comes from `state`; with a copy-on-write
    /// sandbox, the review tools too (`commit` and `discard` only when
    /// the agent is allowed to commit).
    pub fn new(state: Arc<State>) -> Self {
        let mut tool_router = Self::tool_router();
        if state.cow().is_some() {
            let mut review = Self::review_router();
            if !state.allow_commit() {
                for name in review::COMMIT_TOOLS {
                    review.remove_route(name);
                }
            }
            tool_router.merge(review);
        }
        HakoServer {
            owner: Arc::new(Owner::new(state.generation())),
            state,
            tool_router,
        }
    }

    #[tool(
        name = "read_file",
        description = READ_FILE,
        annotations(title = "Read file", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn read_file(&self, Parameters(args): Parameters<ReadFileArgs>) -> CallToolResult {
        self.blocking("read_file", move |state, sandbox| {
            files::read_file(
                state,
                sandbox,
                &PathBuf::from(args.path),
                args.offset,
                args.limit,
            )
        })
        .await
    }

    #[tool(
        name = "write_file",
        description = WRITE_FILE,
        annotations(title = "Write file", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn write_file(&self, Parameters(args): Parameters<WriteFileArgs>) -> CallToolResult {
        self.blocking("write_file", move |state, sandbox| {
            files::write_file(state, sandbox, &PathBuf::from(args.path), &args.content)
        })
        .await
    }

    #[tool(
        name = "edit_file",
        description = EDIT_FILE,
        annotations(title = "Edit file", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn edit_file(&self, Parameters(args): Parameters<EditFileArgs>) -> CallToolResult {
        self.blocking("edit_file", move |state, sandbox| {
            files::edit_file(
                state,
                sandbox,
                &PathBuf::from(args.path),
                &args.old_string,
                &args.new_string,
                args.replace_all,
            )
        })
        .await
    }

    #[tool(
        name = "list_dir",
        description = LIST_DIR,
        annotations(title = "List directory", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_dir(&self, Parameters(args): Parameters<ListDirArgs>) -> CallToolResult {
        self.blocking("list_dir", move |state, sandbox| {
            let path = PathBuf::from(args.path.unwrap_or_else(|| ".".into()));
            files::list_dir(state, sandbox, &path)
        })
        .await
    }

    #[tool(
        name = "glob",
        description = GLOB,
        annotations(title = "Find files", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn glob(&self, Parameters(args): Parameters<GlobArgs>) -> CallToolResult {
        self.blocking("glob", move |state, sandbox| {
            let base = args.path.map(PathBuf::from);
            files::glob(state, sandbox, &args.pattern, base.as_deref())
        })
        .await
    }

    #[tool(
        name = "grep",
        description = GREP,
        annotations(title = "Search file contents", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn grep(&self, Parameters(args): Parameters<GrepToolArgs>) -> CallToolResult {
        self.blocking("grep", move |state, sandbox| {
            let max_results = match args.max_results.unwrap_or(100) {
                0 => return Err(ToolError::new("max_results must be at least 1")),
                n if n > 1000 => {
                    return Err(ToolError::new(format!(
                        "max_results is {n}; the most allowed is 1000"
                    )))
                }
                n => n as usize,
            };
            files::grep(
                state,
                sandbox,
                &GrepArgs {
                    pattern: args.pattern,
                    path: args.path.map(PathBuf::from),
                    glob: args.glob,
                    case_insensitive: args.case_insensitive,
                    max_results,
                },
            )
        })
        .await
    }

    #[tool(
        name = "run_command",
        description = RUN_COMMAND,
        // Open world: a command reaches the network when the sandbox's policy
        // lets it (`--net allow` or `host`, and always on the host backend).
        annotations(title = "Run command", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = true)
    )]
    async fn run_command(&self, Parameters(args): Parameters<RunCommandArgs>) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("run_command", move |state, sandbox| {
            let timeout = secs(
                args.timeout_secs,
                exec::DEFAULT_TIMEOUT_SECS,
                exec::MAX_TIMEOUT_SECS,
                "timeout_secs",
            )?;
            if timeout.is_zero() {
                return Err(ToolError::new("timeout_secs must be at least 1"));
            }
            let wait = secs(
                args.wait_secs,
                exec::DEFAULT_WAIT_SECS,
                exec::MAX_WAIT_SECS,
                "wait_secs",
            )?;
            exec::run_command(
                state,
                &owner,
                sandbox,
                RunRequest {
                    command: args.command,
                    cwd: args.cwd.map(PathBuf::from),
                    timeout,
                    wait,
                    session: args.session,
                    keep_stdin_open: args.keep_stdin_open,
                },
            )
        })
        .await
    }

    #[tool(
        name = "open_session",
        description = OPEN_SESSION,
        annotations(title = "Open shell session", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false)
    )]
    async fn open_session(&self) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("open_session", move |state, sandbox| {
            exec::open_session(state, &owner, sandbox)
        })
        .await
    }

    #[tool(
        name = "close_session",
        description = CLOSE_SESSION,
        annotations(title = "Close shell session", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn close_session(&self, Parameters(args): Parameters<SessionArgs>) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("close_session", move |state, sandbox| {
            exec::close_session(state, &owner, sandbox, args.session)
        })
        .await
    }

    #[tool(
        name = "read_output",
        description = READ_OUTPUT,
        annotations(title = "Read process output", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn read_output(&self, Parameters(args): Parameters<ReadOutputArgs>) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("read_output", move |state, sandbox| {
            let wait = secs(args.wait_secs, 0, exec::MAX_WAIT_SECS, "wait_secs")?;
            let stream = match args.stream.unwrap_or_default() {
                StreamArg::Stdout => Stream::Stdout,
                StreamArg::Stderr => Stream::Stderr,
            };
            exec::read_output(
                state,
                &owner,
                sandbox,
                args.process,
                args.offset,
                stream,
                wait,
            )
        })
        .await
    }

    #[tool(
        name = "send_input",
        description = SEND_INPUT,
        annotations(title = "Send input to process", read_only_hint = false, destructive_hint = true, idempotent_hint = false, open_world_hint = false)
    )]
    async fn send_input(&self, Parameters(args): Parameters<SendInputArgs>) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("send_input", move |state, sandbox| {
            exec::send_input(
                state,
                &owner,
                sandbox,
                args.process,
                &args.data,
                args.close_stdin,
            )
        })
        .await
    }

    #[tool(
        name = "kill_process",
        description = KILL_PROCESS,
        annotations(title = "Kill process", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false)
    )]
    async fn kill_process(&self, Parameters(args): Parameters<ProcessArgs>) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("kill_process", move |state, sandbox| {
            exec::kill_process(state, &owner, sandbox, args.process)
        })
        .await
    }

    #[tool(
        name = "list_processes",
        description = LIST_PROCESSES,
        annotations(title = "List processes", read_only_hint = true, destructive_hint = false, idempotent_hint = true, open_world_hint = false)
    )]
    async fn list_processes(&self) -> CallToolResult {
        let owner = self.owner.clone();
        self.blocking("list_processes", move |_, sandbox| {
            exec::list_processes(&owner, sandbox)
        })
        .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for HakoServer {
    /// Routes the call; arguments that do not fit the tool's schema (rmcp
    /// answers those as a tool error before any tool runs) get a clearer
    /// message and an audit record, like every other failure.
    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        // A review tool this server does not offer is answered with why,
        // not as an unknown tool.
        if !self.tool_router.has_route(&name) {
            let err = if review::COMMIT_TOOLS.contains(&name.as_str()) && self.state.cow().is_some()
            {
                Some(review::commit_refused(&self.state))
            } else if review::REVIEW_TOOLS.contains(&name.as_str())
                || review::COMMIT_TOOLS.contains(&name.as_str())
            {
                Some(crate::state::not_cow())
            } else {
                None
            };
            if let Some(err) = err {
                self.state.record_failure(&name, &err);
                return Ok(CallToolResult::error(vec![ContentBlock::text(err.message)]).into());
            }
        }
        let ctx = ToolCallContext::new(self, request, context);
        match self.tool_router.call(ctx).await {
            Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
                let text: String = result
                    .content
                    .iter()
                    .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
                    .collect();
                let Some(detail) = text.strip_prefix("failed to deserialize parameters: ") else {
                    return Ok(CallToolResponse::Complete(result));
                };
                // The detail can quote a whole argument (a value of the
                // wrong type): a few hundred characters say what is wrong.
                let err = ToolError::new(format!(
                    "invalid arguments for {name}: {}; see the tool's input schema",
                    shorten(detail, DETAIL_CHARS)
                ));
                self.state.record_failure(&name, &err);
                Ok(CallToolResult::error(vec![ContentBlock::text(err.message)]).into())
            }
            Err(err) => {
                self.state
                    .record_failure(&name, &ToolError::new(err.message.to_string()));
                Err(err)
            }
            other => other,
        }
    }

    fn get_info(&self) -> ServerConfig {
        let instructions = match (self.state.cow().is_some(), self.state.allow_commit()) {
            (false, _) => INSTRUCTIONS.to_owned(),
            (true, false) => format!("{INSTRUCTIONS} {COW_INSTRUCTIONS} Committing them to the real workspace is left to the person."),
            (true, true) => format!("{INSTRUCTIONS} {COW_INSTRUCTIONS} commit applies them to the real workspace and discard throws them away."),
        };
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("hako", env!("CARGO_PKG_VERSION")))
            .with_instructions(instructions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_glob_description_states_the_ignore_bounds_in_force() {
        let file = format!("at most {} KiB each", crate::ignores::IGNORE_FILE_CAP >> 10);
        let patterns = format!("{} patterns in all", crate::ignores::IGNORE_TOTAL_PATTERNS);
        assert!(GLOB.contains(&file) && GLOB.contains(&patterns), "{GLOB}");
    }
}
