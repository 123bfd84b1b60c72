//! `hako vm build`: the vm backend's guest image, a kernel and an
//! initramfs made from Debian's cloud kernel package and the static guest.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use hako_vm::image::{self, BuildSpec};

use crate::exit;

/// Flags of `hako vm`.
#[derive(Debug, Args)]
pub struct VmArgs {
    #[command(subcommand)]
    command: VmCommand,
}

#[derive(Debug, Subcommand)]
enum VmCommand {
    /// Build the guest image: Debian's linux-image-cloud-amd64 (fetched
    /// with apt-get download, never the host's /boot) and an initramfs
    /// with the static guest as init and the modules it loads.
    Build(BuildArgs),
}

#[derive(Debug, Args)]
struct BuildArgs {
    /// Where the image goes [default: ~/.local/share/hako/vm].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// A kernel to boot in place of Debian's (its drivers built in, or
    /// loaded by --initrd), for example one with PVM guest support.
    #[arg(long, value_name = "PATH")]
    kernel: Option<PathBuf>,
    /// An initramfs to use as it is (it must start the guest with --vm).
    #[arg(long, value_name = "PATH")]
    initrd: Option<PathBuf>,
    /// The static guest [default: hako-guest-static beside hako].
    #[arg(long, value_name = "PATH")]
    guest: Option<PathBuf>,
    /// The statically linked busybox for the guest's tools.
    #[arg(long, value_name = "PATH", default_value = hako_container::image::DEFAULT_BUSYBOX)]
    busybox: PathBuf,
}

/// Runs `hako vm`.
pub fn run(args: VmArgs) -> u8 {
    match args.command {
        VmCommand::Build(args) => build(args),
    }
}

fn build(args: BuildArgs) -> u8 {
    let fail = |e: &dyn std::fmt::Display| {
        eprintln!("hako: {}", crate::show::message(&e.to_string()));
        exit::SANDBOX_FAILED
    };
    let Some(dir) = args.dir.clone().or_else(image::default_dir) else {
        eprintln!("hako: no --dir given and no HOME to put the image under");
        return exit::SANDBOX_FAILED;
    };
    let guest = match hako_container::locate_static_guest(hako_vm::NAME, args.guest.as_deref()) {
        Ok(g) => g,
        Err(e) => return fail(&e),
    };
    let spec = BuildSpec {
        dir: dir.clone(),
        kernel: args.kernel,
        initrd: args.initrd,
        guest,
        busybox: args.busybox,
    };
    match image::build(&spec) {
        Ok(built) => {
            println!("kernel: {}", built.kernel.display());
            println!("initramfs: {}", built.initrd.display());
            if let Some(release) = &built.release {
                println!("release: {release}");
            }
            if !built.modules.is_empty() {
                println!("modules: {}", built.modules.join(" "));
            }
            0
        }
        Err(e) => fail(&e),
    }
}
