//! `hako gc`: removes what hako processes that no longer run left behind
//! (containers after a `kill -9`, their copy-on-write volumes and the
//! seccomp profiles written for them, gVisor bundles, egress proxies' socket directories). Each sandbox opening does the same once per process.
//! gVisor bundles are looked for in hako's private directory only, and an
//! entry there that is not this user's plain directory is reported as
//! skipped, never acted on (see `hako_docker::gc` and `hako_gvisor::gc`).

use clap::Args;
use hako_container::runner::CliRunner;

use crate::exit;

/// Flags of `hako gc`.
#[derive(Debug, Args)]
pub struct GcArgs {}

/// Runs `hako gc`.
pub fn run(_args: GcArgs) -> u8 {
    let mut code = 0;
    match hako_container::engine::shared(&CliRunner) {
        Ok(engine) => {
            match hako_docker::gc::collect(&engine, &CliRunner) {
                Ok(removed) => {
                    for name in removed {
                        println!("removed container {name}");
                    }
                }
                Err(e) => {
                    eprintln!("hako: {}", crate::show::message(&e.to_string()));
                    code = exit::SANDBOX_FAILED;
                }
            }
            // After the containers, which may hold one.
            match hako_docker::gc::collect_volumes(&engine, &CliRunner) {
                Ok(removed) => {
                    for name in removed {
                        println!("removed copy-on-write volume {name}");
                    }
                }
                Err(e) => {
                    eprintln!("hako: {}", crate::show::message(&e.to_string()));
                    code = exit::SANDBOX_FAILED;
                }
            }
        }
        Err(e) => tracing::info!("no container runtime to collect from: {e}"),
    }
    for profile in hako_docker::gc::collect_profiles() {
        println!("removed seccomp profile {}", profile.display());
    }
    for dir in hako_net::remove_stale_dirs(None) {
        println!("removed egress proxy directory {}", dir.display());
    }
    let runsc = hako_gvisor::runsc_path(None);
    match hako_gvisor::gc::collect_bundles(&CliRunner, &runsc) {
        Ok(report) => {
            for bundle in report.removed {
                println!("removed gvisor bundle {}", bundle.display());
            }
            // Not this user's, or not a plain directory: reported, never
            // acted on, and no failure of gc's.
            for entry in report.skipped {
                let message = format!("skipped {entry}");
                eprintln!("hako: {}", crate::show::message(&message));
            }
            for e in report.failed {
                eprintln!("hako: {}", crate::show::message(&e.to_string()));
                code = exit::SANDBOX_FAILED;
            }
        }
        Err(e) => {
            eprintln!("hako: {}", crate::show::message(&e.to_string()));
            code = exit::SANDBOX_FAILED;
        }
    }
    code
}
