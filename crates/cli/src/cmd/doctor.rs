//! `hako doctor`: which backends work here.

use clap::Args;
use hako_core::{Command, Isolation};
use serde::Serialize;

use crate::backend::{self, BackendKind, SandboxSpec};

/// Flags of `hako doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    backend: &'static str,
    isolation: Isolation,
    works: bool,
    reason: Option<String>,
    hint: Option<String>,
}

/// Opens a sandbox of `kind` in a temporary workspace and runs `true`.
fn check(kind: BackendKind) -> Result<(), backend::Unavailable> {
    backend::probe(kind)?;
    let unavailable = |e: &dyn std::fmt::Display| backend::Unavailable {
        reason: e.to_string(),
        hint: "run with HAKO_LOG=debug for details".into(),
    };
    let dir = std::env::temp_dir().join(format!("hako-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| unavailable(&e))?;
    let spec = SandboxSpec::new(dir.clone());
    let result = backend::open(kind, &spec).and_then(|sb| {
        let out = sb.exec(&Command::new(["true"]));
        let _ = sb.close();
        out
    });
    let _ = std::fs::remove_dir_all(&dir);
    match result {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => Err(unavailable(&format!("`true` exited with {:?}", out.status))),
        Err(e) => Err(unavailable(&e)),
    }
}

/// Runs `hako doctor`.
pub fn run(args: DoctorArgs) -> u8 {
    let reports: Vec<Report> = BackendKind::ALL
        .into_iter()
        .map(|kind| {
            let result = check(kind);
            Report {
                backend: kind.name(),
                isolation: kind.isolation(),
                works: result.is_ok(),
                reason: result.as_ref().err().map(|u| u.reason.clone()),
                hint: result.err().map(|u| u.hint),
            }
        })
        .collect();
    let best = reports.iter().find(|r| r.works).map(|r| r.backend);
    if args.json {
        let obj = serde_json::json!({ "backends": reports, "auto": best });
        println!("{}", serde_json::to_string_pretty(&obj).unwrap_or_default());
    } else {
        for r in &reports {
            let status = if r.works { "works" } else { "unavailable" };
            println!(
                "{:<8} isolation {:<8} {status}",
                r.backend,
                r.isolation.as_str()
            );
            if let Some(reason) = &r.reason {
                println!("         reason: {reason}");
            }
            if let Some(hint) = &r.hint {
                println!("         hint:   {hint}");
            }
        }
        match best {
            Some(name) => println!("--backend auto picks: {name}"),
            None => println!("--backend auto picks: nothing works here"),
        }
    }
    u8::from(best.is_none())
}
