//! `hako run`: run one command in a sandbox.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use hako_audit::{is_refusal, AuditLog, Exec, Failure, FrontEnd, Record, SandboxLost};
use hako_core::{
    Command, Isolation, NetDecision, NetEvent, NetworkAccess, Output, Sandbox, Stream,
};
use serde::Serialize;

use super::{parse_duration, SandboxArgs};
use crate::exit;

/// Most bytes `--stdin` reads from hako's own standard input.
const MAX_STDIN: u64 = 64 << 20;

/// Flags of `hako run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Working directory, relative to the workspace.
    #[arg(long, value_name = "REL")]
    cwd: Option<PathBuf>,
    /// Kill the command and everything it started after DUR (e.g. 30s, 2m,
    /// 500ms) [default: the profile's `timeout`, else none].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    timeout: Option<Duration>,
    /// Feed hako's standard input to the command (at most 64 MiB).
    #[arg(long)]
    stdin: bool,
    /// Print one JSON object with the result instead of streaming output.
    #[arg(long)]
    json: bool,
    /// Append what the run did (the command, how it ended, every network
    /// decision, a refusal) to this hash-chained audit log (`hako audit
    /// verify FILE` checks it) [default: the profile's `audit`, else none].
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Serialize)]
struct JsonResult<'a> {
    exit_code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    stdout_bytes: u64,
    stderr_bytes: u64,
    duration_ms: u128,
    timed_out: bool,
    /// The sandbox's memory limit killed it (exit code 137, as for any
    /// `SIGKILL`).
    oom_killed: bool,
    backend: &'a str,
    /// With `--backend auto`: why it picked `backend` (and passed over
    /// each stronger one).
    #[serde(skip_serializing_if = "Option::is_none")]
    backend_choice: Option<String>,
    isolation: Isolation,
    /// A `vm` sandbox's accelerator (`kvm`, `tcg`).
    #[serde(skip_serializing_if = "Option::is_none")]
    accelerator: Option<&'a str>,
    /// What the sandbox could reach (`none`, `allowlist`, `host`), as
    /// enforced.
    network_access: NetworkAccess,
    /// The egress proxy's decisions during the run (`--net allow`).
    #[serde(skip_serializing_if = "Option::is_none")]
    network: Option<Vec<NetEvent>>,
    /// Decisions left out because too many were made.
    #[serde(skip_serializing_if = "Option::is_none")]
    network_dropped: Option<u64>,
}

/// `--json`'s object for a run that did not complete: the error, and
/// (like a result) the backend and its isolation, `null` only when no
/// backend was chosen yet.
#[derive(Serialize)]
struct JsonError<'a> {
    error: String,
    exit_code: u8,
    backend: Option<&'a str>,
    isolation: Option<Isolation>,
}

/// The backend a failed run was on, and its isolation.
#[derive(Clone, Copy)]
struct On<'a> {
    backend: &'a str,
    isolation: Isolation,
}

impl<'a> On<'a> {
    /// Before the sandbox is open: the backend's isolation as the policy
    /// gate judged it (what its refusal names).
    fn kind(kind: hako_runtime::BackendKind, runtime: Option<&str>) -> On<'static> {
        On {
            backend: kind.name(),
            isolation: kind.isolation_under(runtime),
        }
    }

    /// Once it is open: what the sandbox reports.
    fn caps(caps: &'a hako_core::Capabilities) -> On<'a> {
        On {
            backend: &caps.backend,
            isolation: caps.isolation,
        }
    }
}

fn fail(json: bool, on: Option<On<'_>>, err: &dyn std::fmt::Display, code: u8) -> u8 {
    if json {
        let obj = JsonError {
            error: err.to_string(),
            exit_code: code,
            backend: on.map(|on| on.backend),
            isolation: on.map(|on| on.isolation),
        };
        println!("{}", serde_json::to_string(&obj).unwrap_or_default());
    } else {
        eprintln!("hako: {}", crate::show::message(&err.to_string()));
    }
    code
}

/// Runs `hako run`.
pub fn run(args: RunArgs) -> u8 {
    let json = args.json;
    let plan = args.sandbox.plan();
    // The log is kept out of every directory the sandbox can write.
    let writable = match &plan {
        Ok(plan) => plan.spec.writable(),
        Err(_) => args.sandbox.flags().writable_without_profile(),
    };
    // `--audit`, else the profile's `audit`.
    let audit_path = args
        .audit
        .clone()
        .or_else(|| plan.as_ref().ok().and_then(|plan| plan.audit.clone()));
    let audit = match audit_path
        .as_deref()
        .map(|path| AuditLog::open(path, &writable))
    {
        None => None,
        Some(Ok(log)) => {
            if let Some(cut) = log.repaired() {
                eprintln!("hako: audit log: {cut}; recorded and continued");
            }
            Some(log)
        }
        // A log that does not verify, or lies where the sandbox could
        // reach it, is not written to: fail closed.
        Some(Err(e)) => return fail(json, None, &e, exit::SANDBOX_FAILED),
    };
    let argv = args.command.clone();
    // What did not run is recorded: a `refusal` when a policy refused it
    // (`refused`), an `error` otherwise.
    let refuse = |on: Option<On<'_>>, err: &dyn std::fmt::Display, code: u8, refused: bool| {
        if let Some(log) = &audit {
            let mut failure = Failure::new(FrontEnd::Run, &err.to_string());
            failure.backend = on.map(|on| on.backend.to_string());
            failure.argv = Some(argv.clone());
            failure.exit_code = Some(code);
            let _ = log.write(&failure.record(refused));
        }
        fail(json, on, err, code)
    };
    let plan = match plan {
        Ok(plan) => plan,
        Err(e) => return refuse(None, &e, exit::SANDBOX_FAILED, false),
    };
    // `--timeout`, else the profile's `timeout`.
    let timeout = args.timeout.or(plan.timeout);
    let (kind, backend_choice) = match plan.backend().kind() {
        Some(kind) => (kind, None),
        None => match hako_runtime::choose_auto() {
            Ok(choice) => (choice.kind, Some(choice.why())),
            Err(e) => return refuse(None, &e, exit::SANDBOX_FAILED, false),
        },
    };
    // The policy gate comes first: a run that needs a stronger boundary
    // than this backend has never starts.
    let chosen = On::kind(kind, plan.spec.runtime.as_deref());
    let opener = match hako_runtime::Opener::with_kind(kind, plan, Isolation::None) {
        Ok(opener) => opener,
        Err(err) => return refuse(Some(chosen), &err, exit::SANDBOX_FAILED, true),
    };
    let spec = opener.spec().clone();
    // A copy-on-write workspace: its layers held by the sandbox, until
    // the run ends.
    let layers = match opener.hold(None) {
        Ok(layers) => layers,
        Err(e) => return refuse(Some(chosen), &e, exit::SANDBOX_FAILED, true),
    };
    // One command, from this thread: no thread of its own need read the
    // guest; and hako exits once it is done (set below).
    let exit_follows = hako_runtime::ExitFollowsClose::default();
    let driver = hako_runtime::DriverOptions::one_shot(&exit_follows);
    let sandbox = match opener.open_on(layers, &driver) {
        Ok(sb) => sb,
        Err(e) => return refuse(Some(chosen), &e, exit::SANDBOX_FAILED, is_refusal(&e)),
    };
    let caps = sandbox.capabilities();
    let on = On::caps(caps);
    let mut command = Command::new(args.command).max_output(spec.max_output);
    command.cwd = args.cwd;
    command.timeout = timeout;
    if args.stdin {
        let mut data = Vec::new();
        match std::io::stdin().take(MAX_STDIN + 1).read_to_end(&mut data) {
            Ok(n) if n as u64 > MAX_STDIN => {
                let err = format!("standard input is larger than {MAX_STDIN} bytes; pass large inputs as files in the workspace");
                return refuse(Some(on), &err, exit::SANDBOX_FAILED, false);
            }
            Ok(_) => command.stdin = Some(data),
            Err(e) => return refuse(Some(on), &e, exit::SANDBOX_FAILED, false),
        }
    }
    let result = execute(sandbox.as_ref(), &command, json);
    // hako exits next: once the command is reported (its whole tree
    // gone), the guest's own end need not be waited for. After a failed
    // exec, the sandbox is closed and waited for as usual.
    if result.is_ok() {
        exit_follows.set();
    }
    // Closing ends every connection from inside, so each is recorded.
    // (The layers are free for review once the sandbox is dropped.)
    let _ = sandbox.close();
    let network = sandbox.network_events().map(|n| n.take_network_events());
    let output = match result {
        Ok(output) => output,
        Err(e) => {
            // A sandbox lost mid-run (its guest killed, its container or
            // engine stopped) is recorded as such, then the run's error.
            if let (Some(log), Some(lost)) =
                (&audit, SandboxLost::from_error(FrontEnd::Run, None, &e))
            {
                let _ = log.write(&Record::SandboxLost(lost));
            }
            return refuse(Some(on), &e, exit::for_error(&e), is_refusal(&e));
        }
    };
    if let Some(log) = &audit {
        record_run(log, &command, &caps.backend, &output, network.as_ref());
    }
    if json {
        let obj = JsonResult {
            exit_code: output.status.code(),
            signal: output.status.signal(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
            stdout_truncated: output.stdout_truncated,
            stderr_truncated: output.stderr_truncated,
            stdout_bytes: output.stdout_total,
            stderr_bytes: output.stderr_total,
            duration_ms: output.duration.as_millis(),
            timed_out: output.timed_out,
            oom_killed: output.oom_killed,
            backend: &caps.backend,
            backend_choice,
            isolation: caps.isolation,
            accelerator: caps.accelerator.as_deref(),
            network_access: caps.network,
            network_dropped: network.as_ref().map(|(_, d)| *d).filter(|&d| d > 0),
            network: network.map(|(events, _)| events),
        };
        println!("{}", serde_json::to_string(&obj).unwrap_or_default());
    } else {
        report_truncation(&output);
        report_refusals(network.as_ref().map(|(e, _)| e.as_slice()).unwrap_or(&[]));
        if output.timed_out {
            eprintln!(
                "hako: timed out after {:?}; every process the command started was killed. Running the same command again will time out again: give it a longer --timeout, make it do less, or start it in the background and check on it",
                command.timeout.unwrap_or_default()
            );
        }
        if output.oom_killed {
            eprintln!("hako: {}", exit::OOM_KILLED_MESSAGE);
        }
    }
    exit::for_output(&output)
}

/// The run's records: every network decision, then the command and how it
/// ended. A record that cannot be written is reported, not fatal (the
/// command has run).
fn record_run(
    log: &AuditLog,
    command: &Command,
    backend: &str,
    output: &Output,
    network: Option<&(Vec<NetEvent>, u64)>,
) {
    let mut records = Vec::new();
    if let Some((events, dropped)) = network {
        records.extend(events.iter().cloned().map(Record::Net));
        if *dropped > 0 {
            records.push(Record::NetDropped { dropped: *dropped });
        }
    }
    records.push(Record::Exec(
        Exec::new(FrontEnd::Run, backend, command).output(output),
    ));
    for record in &records {
        if let Err(e) = log.write(record) {
            eprintln!("hako: {}", crate::show::message(&e.to_string()));
            return;
        }
    }
}

/// Runs the command, streaming its output live when not printing JSON.
fn execute(
    sandbox: &dyn Sandbox,
    command: &Command,
    json: bool,
) -> Result<Output, hako_core::Error> {
    match sandbox.exec_stream() {
        Some(streamer) if !json => {
            let mut sink = |stream: Stream, chunk: &[u8]| {
                // A closed terminal or pipe on our side must not stop the
                // command: ignore write errors.
                let _ = match stream {
                    Stream::Stdout => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(chunk).and_then(|()| out.flush())
                    }
                    Stream::Stderr => std::io::stderr().lock().write_all(chunk),
                };
            };
            streamer.exec_stream(command, &mut sink)
        }
        _ => {
            let output = sandbox.exec(command)?;
            if !json {
                let _ = std::io::stdout().lock().write_all(&output.stdout);
                let _ = std::io::stderr().lock().write_all(&output.stderr);
            }
            Ok(output)
        }
    }
}

/// One line on stderr per connection the egress proxy refused, so that a
/// failing download says why. The host was named from inside: escaped.
fn report_refusals(events: &[NetEvent]) {
    for e in events.iter().filter(|e| e.decision == NetDecision::Refused) {
        let line = format!(
            "the egress proxy refused {}:{} (rule {}){}",
            e.host,
            e.port,
            e.rule,
            e.message
                .as_deref()
                .map(|m| format!(": {m}"))
                .unwrap_or_default()
        );
        eprintln!("hako: {}", crate::show::message(&line));
    }
}

fn report_truncation(output: &Output) {
    for (name, truncated, kept, total) in [
        (
            "stdout",
            output.stdout_truncated,
            output.stdout.len(),
            output.stdout_total,
        ),
        (
            "stderr",
            output.stderr_truncated,
            output.stderr.len(),
            output.stderr_total,
        ),
    ] {
        if truncated {
            eprintln!("hako: {name} truncated: kept {kept} of {total} bytes (raise --max-output to keep more)");
        }
    }
}
