//! `hako serve`: the HTTP/JSON API (see the `hako-serve` crate and its
//! `openapi.json`).

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use hako_core::Isolation;

use super::SandboxArgs;
use crate::exit;

/// Flags of `hako serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Every sandbox a client opens has these settings (the server's
    /// policy; clients cannot change it).
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// Address to listen on, e.g. 127.0.0.1:8700 (port 0: one the system
    /// chooses, named in the start-up line and by --ready-json).
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// Once listening, print one JSON line on stdout and flush it:
    /// {"url": "http://ADDR", "listen": ADDR, "pid": N, "backend": NAME}.
    #[arg(long)]
    ready_json: bool,
    /// When stdin ends (the process that started the server died or
    /// closed it), close every sandbox and exit 0.
    #[arg(long)]
    exit_on_stdin_eof: bool,
    /// A file holding the bearer token clients must send; without it a
    /// token is generated and printed once on stderr.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Record every effect in this hash-chained audit log [default: the
    /// profile's `audit`, else none].
    #[arg(long, value_name = "FILE")]
    audit: Option<PathBuf>,
    /// The most sandboxes open at once; one more is refused (429).
    #[arg(long, value_name = "N", default_value_t = hako_serve::MAX_SANDBOXES as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_sandboxes: u64,
    /// With --cow: clients may commit and discard a sandbox's changes
    /// (`POST .../commit`, `.../discard`) [default: refused (403);
    /// committing stays with the person, `hako commit NAME`].
    #[arg(long)]
    allow_agent_commit: bool,
    /// Answer SWE-ReX's remote runtime protocol (SWE-agent's remote
    /// deployment) instead of the /v1 API: one sandbox, named sessions,
    /// the token as X-API-Key.
    #[arg(long)]
    swerex: bool,
    /// Answer E2B's API (the unmodified `e2b` SDK, with E2B_API_URL and
    /// E2B_SANDBOX_URL set to this server, E2B_API_KEY to its token)
    /// instead of the /v1 API: each sandbox in a workspace of its own,
    /// /home/user mapped to it, killed when its timeout passes.
    #[arg(long, conflicts_with = "swerex")]
    e2b: bool,
    /// With --e2b: the directory each sandbox's workspace is made in (and
    /// removed from) [default: a new private directory under the system's
    /// temporary directory, removed when the server stops].
    #[arg(long, value_name = "DIR", requires = "e2b")]
    e2b_root: Option<PathBuf>,
}

/// Runs `hako serve`.
pub fn run(args: ServeArgs) -> u8 {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("hako: {}", crate::show::message(&e.to_string()));
        exit::SANDBOX_FAILED
    };
    let plan = match args.sandbox.plan() {
        Ok(plan) => plan,
        Err(e) => return fail(&e),
    };
    if let Some(cow) = &plan.cow {
        if cow.name.is_some() {
            return fail(&"hako serve gives each sandbox layers of its own: a client names one in its create request ({\"name\": NAME}); --name (or the profile's `name`) is for one sandbox");
        }
    }
    if args.allow_agent_commit && plan.cow.is_none() {
        return fail(&"--allow-agent-commit lets clients commit a copy-on-write sandbox's changes: give --cow (or the profile's `cow = true`) too");
    }
    // `--audit`, else the profile's `audit`.
    let audit_path = args.audit.clone().or_else(|| plan.audit.clone());
    if args.swerex && plan.cow.is_some() {
        return fail(&"--swerex serves SWE-ReX's protocol, which has no way to review, commit or keep a copy-on-write sandbox's changes: leave out --cow (or the profile's `cow = true`)");
    }
    if args.e2b && plan.cow.is_some() {
        return fail(&"--e2b gives each sandbox a plain workspace of its own, which E2B's API has no way to review or commit: leave out --cow (or the profile's `cow = true`)");
    }
    // Checked (or made) before anything listens.
    let root = if args.e2b {
        match e2b_root(args.e2b_root.as_deref()) {
            Ok(root) => Some(root),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    // Every sandbox a client asks for is opened from this one choice, and
    // a backend weaker than --min-isolation refuses to start.
    let opener = match hako_runtime::Opener::from_plan(plan, Isolation::None) {
        Ok(opener) => opener,
        Err(e) => return fail(&e),
    };
    // What the backend needs (its guest, its image) is checked now: a
    // server that cannot open a sandbox refuses to start, with the fix,
    // rather than failing its clients' first calls.
    if let Err(u) = hako_runtime::preflight(opener.kind(), opener.spec()) {
        return fail(&format!(
            "the {} backend cannot start here: {u}",
            opener.kind().name()
        ));
    }
    if opener.kind().isolation() == Isolation::None && opener.min_isolation() == Isolation::None {
        eprintln!(
            "hako serve: warning: the {} backend isolates nothing: every client's commands run as you, on this host; pass --min-isolation process to refuse it",
            opener.kind().name()
        );
    }
    if let Some(warning) = args
        .token_file
        .as_deref()
        .and_then(hako_runtime::http::token_file_warning)
    {
        eprintln!("hako serve: warning: {warning}");
    }
    let token = match &args.token_file {
        Some(path) => match hako_runtime::token::read(path) {
            Ok(Some(t)) => t,
            Ok(None) => return fail(&format!("{} is empty", path.display())),
            Err(e) => return fail(&format!("cannot read {}: {e}", path.display())),
        },
        None => match hako_runtime::token::generate() {
            Ok(t) => {
                eprintln!("hako serve: token {t}");
                t
            }
            Err(e) => return fail(&format!("cannot generate a token: {e}")),
        },
    };
    let writable = opener.spec().writable();
    let audit = match audit_path
        .as_deref()
        .map(|path| hako_audit::AuditLog::open(path, &writable))
    {
        None => None,
        Some(Ok(log)) => {
            if let Some(cut) = log.repaired() {
                eprintln!("hako serve: audit log: {cut}; recorded and continued");
            }
            Some(Arc::new(log))
        }
        Some(Err(e)) => return fail(&e),
    };
    let listener = match std::net::TcpListener::bind(&args.listen) {
        Ok(l) => l,
        Err(e) => return fail(&format!("cannot listen on {}: {e}", args.listen)),
    };
    let local = match listener.local_addr() {
        Ok(addr) => addr,
        Err(e) => return fail(&format!("cannot tell the address of {}: {e}", args.listen)),
    };
    eprintln!(
        "hako serve: listening on {local} ({} backend{})",
        opener.kind().name(),
        if args.swerex {
            ", SWE-ReX protocol"
        } else if args.e2b {
            ", E2B API"
        } else {
            ""
        }
    );
    if args.ready_json {
        // One line, flushed: a client that started this server reads it
        // to learn where to connect (the listener already queues
        // connections).
        let line = serde_json::json!({
            "url": format!("http://{local}"),
            "listen": local.to_string(),
            "pid": std::process::id(),
            "backend": opener.kind().name(),
        });
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            return fail(&format!("cannot write the ready line on stdout: {e}"));
        }
    }
    if let Some(warning) = listener
        .local_addr()
        .ok()
        .and_then(hako_runtime::http::listen_warning)
    {
        eprintln!("hako serve: warning: {warning}");
    }
    let e2b = if let Some(root) = root {
        let opener = opener.clone();
        Some((
            hako_serve::E2bConfig {
                root: root.path().to_path_buf(),
                open_in: Box::new(move |workspace| opener.open_in(workspace)),
            },
            root,
        ))
    } else {
        None
    };
    let mut config = hako_serve::ServeConfig::with_opener(opener, token, audit);
    // SIGINT and SIGTERM stop it: every sandbox is closed, then the audit
    // log gets its closing record.
    config.stop_on_signals = true;
    config.max_sandboxes = usize::try_from(args.max_sandboxes).unwrap_or(usize::MAX);
    config.allow_agent_commit = args.allow_agent_commit;
    config.stop_on_stdin_eof = args.exit_on_stdin_eof;
    config.swerex = args.swerex;
    // The root made here lives (and is removed) with the server.
    let (e2b, _root) = match e2b {
        Some((c, root)) => (Some(c), Some(root)),
        None => (None, None),
    };
    config.e2b = e2b;
    match hako_serve::serve(listener, config) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}

/// Where `--e2b` makes each sandbox's workspace.
enum E2bRoot {
    /// `--e2b-root DIR`: the caller's, kept.
    Given(PathBuf),
    /// A private directory made for the server, removed when it stops.
    Made(PathBuf),
}

impl E2bRoot {
    fn path(&self) -> &std::path::Path {
        match self {
            E2bRoot::Given(p) | E2bRoot::Made(p) => p,
        }
    }
}

impl Drop for E2bRoot {
    fn drop(&mut self) {
        if let E2bRoot::Made(p) = self {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

/// The root given (it must be a directory), or a new private one.
fn e2b_root(given: Option<&std::path::Path>) -> Result<E2bRoot, String> {
    if let Some(dir) = given {
        return match std::fs::canonicalize(dir) {
            Ok(p) if p.is_dir() => Ok(E2bRoot::Given(p)),
            Ok(_) => Err(format!("--e2b-root {}: not a directory", dir.display())),
            Err(e) => Err(format!("--e2b-root {}: {e}", dir.display())),
        };
    }
    let mut random = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut random))
        .map_err(|e| format!("cannot make the E2B root: {e}"))?;
    let name: String = random.iter().map(|b| format!("{b:02x}")).collect();
    let dir = std::env::temp_dir().join(format!("hako-e2b-{name}"));
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot make the E2B root {}: {e}", dir.display()))?;
    }
    let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
    Ok(E2bRoot::Made(dir))
}
