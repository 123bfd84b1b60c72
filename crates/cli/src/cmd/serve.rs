//! `hako serve`: the HTTP/JSON API (see the `hako-serve` crate and its
//! `openapi.json`).

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
    /// Address to listen on, e.g. 127.0.0.1:8700.
    #[arg(long, value_name = "ADDR")]
    listen: String,
    /// A file holding the bearer token clients must send; without it a
    /// token is generated and printed once on stderr.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Record every effect in this hash-chained audit log.
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
    if args.swerex && plan.cow.is_some() {
        return fail(&"--swerex serves SWE-ReX's protocol, which has no way to review, commit or keep a copy-on-write sandbox's changes: leave out --cow (or the profile's `cow = true`)");
    }
    // Every sandbox a client asks for is opened from this one choice, and
    // a backend weaker than --min-isolation refuses to start.
    let opener = match hako_runtime::Opener::from_plan(plan, Isolation::None) {
        Ok(opener) => opener,
        Err(e) => return fail(&e),
    };
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
    let audit = match args
        .audit
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
    eprintln!(
        "hako serve: listening on {} ({} backend{})",
        args.listen,
        opener.kind().name(),
        if args.swerex {
            ", SWE-ReX protocol"
        } else {
            ""
        }
    );
    if let Some(warning) = listener
        .local_addr()
        .ok()
        .and_then(hako_runtime::http::listen_warning)
    {
        eprintln!("hako serve: warning: {warning}");
    }
    let mut config = hako_serve::ServeConfig::with_opener(opener, token, audit);
    // SIGINT and SIGTERM stop it: every sandbox is closed, then the audit
    // log gets its closing record.
    config.stop_on_signals = true;
    config.max_sandboxes = usize::try_from(args.max_sandboxes).unwrap_or(usize::MAX);
    config.allow_agent_commit = args.allow_agent_commit;
    config.swerex = args.swerex;
    match hako_serve::serve(listener, config) {
        Ok(()) => 0,
        Err(e) => fail(&e),
    }
}
