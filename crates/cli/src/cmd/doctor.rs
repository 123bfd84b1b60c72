//! `hako doctor`: which backends work here.

use clap::Args;
use hako_core::Isolation;
use hako_runtime::BackendKind;
use serde::Serialize;

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

/// Runs `hako doctor`.
pub fn run(args: DoctorArgs) -> u8 {
    let protections = hako_runtime::protections();
    let reports: Vec<Report> = BackendKind::ALL
        .into_iter()
        .map(|kind| {
            let result = hako_runtime::check(kind);
            Report {
                backend: kind.name(),
                isolation: kind.isolation(),
                works: result.is_ok(),
                reason: result.as_ref().err().map(|u| u.reason.clone()),
                hint: result.err().map(|u| u.hint),
            }
        })
        .collect();
    // What `auto` picks, as `hako run` would (never `host`; a backend
    // that works here and runs everyday tools), judged by the checks above
    // rather than probing again.
    let choice = hako_runtime::choose_auto_with(|kind| {
        let report = reports.iter().find(|r| r.backend == kind.name());
        match report {
            Some(r) if r.works => hako_runtime::fit_for_auto(kind),
            _ => Err(hako_runtime::Unavailable {
                reason: report.and_then(|r| r.reason.clone()).unwrap_or_default(),
                hint: report.and_then(|r| r.hint.clone()).unwrap_or_default(),
            }),
        }
    })
    .ok();
    let why = choice.as_ref().map(hako_runtime::AutoChoice::why);
    let best = choice.as_ref().map(|c| c.kind.name());
    if args.json {
        let obj = serde_json::json!({
            "backends": reports,
            "auto": best,
            "auto_why": why,
            "protections": protections,
        });
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
        match &choice {
            Some(choice) => println!("--backend auto picks {}", choice.summary()),
            _ => println!("--backend auto picks: nothing; no isolating backend works here (auto never picks host; name it with --backend host for trusted code only)"),
        }
        for p in &protections {
            let status = if p.available { "yes" } else { "NO" };
            println!("{:<16} {status:<4} {}", p.name, p.detail);
        }
    }
    u8::from(best.is_none())
}
