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

/// A protection the `linux` backend applies, checked on its own, so that a
/// kernel missing one is named rather than inferred from a failed sandbox.
#[derive(Serialize)]
struct Protection {
    name: &'static str,
    available: bool,
    detail: String,
}

fn protections() -> Vec<Protection> {
    let landlock = hako_sys::confine::landlock_abi();
    let seccomp = std::thread::spawn(|| -> Result<(), String> {
        // On a thread of its own, which ends here: filters are per thread.
        hako_sys::raw::set_no_new_privs().map_err(|e| e.to_string())?;
        let policy = hako_seccomp::Policy {
            default: hako_seccomp::Action::Allow,
            rules: vec![hako_seccomp::Rule::errno(
                "acct",
                hako_seccomp::EPERM,
                "probe",
            )],
        };
        let program = hako_seccomp::compile(&policy).map_err(|e| e.to_string())?;
        hako_seccomp::apply(&program).map_err(|e| e.to_string())
    })
    .join()
    .unwrap_or_else(|_| Err("the probe thread panicked".into()));
    let userns = hako_sys::ns::user_namespaces_allowed();
    vec![
        Protection {
            name: "landlock",
            available: landlock.is_some(),
            detail: match landlock {
                Some(abi) => format!("ABI {abi}"),
                None => "not offered by this kernel (not built in, or not in the lsm= list); linux runs only with --best-effort".into(),
            },
        },
        Protection {
            name: "seccomp",
            available: seccomp.is_ok(),
            detail: match seccomp {
                Ok(()) => "filters can be installed".into(),
                Err(e) => format!("cannot install a filter: {e}"),
            },
        },
        Protection {
            name: "user namespaces",
            available: userns.is_ok(),
            detail: match userns {
                Ok(()) => "unprivileged user namespaces allowed".into(),
                Err(e) => e,
            },
        },
    ]
}

/// Runs `hako doctor`.
pub fn run(args: DoctorArgs) -> u8 {
    let protections = protections();
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
        let obj =
            serde_json::json!({ "backends": reports, "auto": best, "protections": protections });
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
        for p in &protections {
            let status = if p.available { "yes" } else { "NO" };
            println!("{:<16} {status:<4} {}", p.name, p.detail);
        }
    }
    u8::from(best.is_none())
}
