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
    // What `auto` picks, as `hako run` would: never `host`, and a backend
    // that works here and runs everyday tools (see `probe_for_auto`).
    let mut passed_over = Vec::new();
    let mut best = None;
    for (kind, report) in BackendKind::ALL.into_iter().zip(&reports) {
        if kind == BackendKind::Host {
            break;
        }
        let fit = if report.works {
            hako_runtime::probe_for_auto(kind)
        } else {
            Err(hako_runtime::Unavailable {
                reason: report.reason.clone().unwrap_or_default(),
                hint: report.hint.clone().unwrap_or_default(),
            })
        };
        match fit {
            Ok(()) => {
                best = Some(kind);
                break;
            }
            Err(why) => passed_over.push((kind, why)),
        }
    }
    let choice = best.map(|kind| hako_runtime::AutoChoice { kind, passed_over });
    let why = choice.as_ref().map(hako_runtime::AutoChoice::why);
    let best = best.map(BackendKind::name);
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
