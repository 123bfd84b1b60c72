//! `hako image build`: a minimal local image, since no registry is needed
//! (or reachable): busybox-static as a root directory, imported into Docker
//! or Podman when one works.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use hako_container::image::{self, ImageSpec};
use hako_container::runner::CliRunner;

use crate::exit;

/// Flags of `hako image`.
#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build the image from the host's static busybox.
    Build(BuildArgs),
}

#[derive(Debug, Args)]
struct BuildArgs {
    /// Image name (the docker tag is NAME:latest).
    #[arg(long, default_value = image::DEFAULT_NAME)]
    name: String,
    /// Where the root directory goes (the gvisor backend's --image)
    /// [default: ~/.local/share/hako/images/NAME].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The statically linked busybox to build from.
    #[arg(long, value_name = "PATH", default_value = image::DEFAULT_BUSYBOX)]
    busybox: PathBuf,
    /// Only write the directory; do not import it into Docker or Podman.
    #[arg(long)]
    no_import: bool,
}

/// Runs `hako image`.
pub fn run(args: ImageArgs) -> u8 {
    match args.command {
        ImageCommand::Build(args) => build(args),
    }
}

fn build(args: BuildArgs) -> u8 {
    let Some(dir) = args.dir.clone().or_else(|| image::default_dir(&args.name)) else {
        eprintln!("hako: no --dir given and no HOME to put the image under");
        return exit::SANDBOX_FAILED;
    };
    let spec = ImageSpec {
        busybox: args.busybox,
        dir: dir.clone(),
    };
    let applets = match image::build_rootfs(&spec) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("hako: {}", crate::show::message(&e.to_string()));
            return exit::SANDBOX_FAILED;
        }
    };
    println!(
        "root directory: {} (busybox, {applets} applets)",
        dir.display()
    );
    if args.no_import {
        return 0;
    }
    let tag = format!("{}:latest", args.name);
    let engine = match hako_container::engine::shared(&CliRunner) {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!(
                "hako: not imported: {}",
                crate::show::message(&e.to_string())
            );
            return exit::SANDBOX_FAILED;
        }
    };
    match image::import(&engine, &CliRunner, &dir, &tag) {
        Ok(()) => {
            println!("{} image: {tag}", engine.name());
            0
        }
        Err(e) => {
            eprintln!("hako: {}", crate::show::message(&e.to_string()));
            exit::SANDBOX_FAILED
        }
    }
}
