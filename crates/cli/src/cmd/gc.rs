//! `hako gc`: removes what hako processes that no longer run left behind
//! (containers after a `kill -9`, gVisor bundles, egress proxies' socket
//! directories). Each sandbox opening does the same once per process.

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
        Ok(engine) => match hako_container::gc::collect(&engine, &CliRunner) {
            Ok(removed) => {
                for name in removed {
                    println!("removed container {name}");
                }
            }
            Err(e) => {
                eprintln!("hako: {}", crate::show::message(&e.to_string()));
                code = exit::SANDBOX_FAILED;
            }
        },
        Err(e) => tracing::info!("no container runtime to collect from: {e}"),
    }
    for dir in hako_net::remove_stale_dirs(None) {
        println!("removed egress proxy directory {}", dir.display());
    }
    for bundle in hako_container::gvisor::stale_bundles() {
        match hako_container::gvisor::remove_bundle(&bundle) {
            Ok(()) => println!("removed gvisor bundle {}", bundle.display()),
            Err(e) => {
                eprintln!("hako: removing {}: {e}", bundle.display());
                code = exit::SANDBOX_FAILED;
            }
        }
    }
    code
}
