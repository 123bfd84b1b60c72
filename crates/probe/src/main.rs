//! `hako-probe`: prints, as JSON, what the process it runs in may do. See
//! the library documentation for the report's keys.

use std::process::ExitCode;

use hako_seccomp::Arch;

const USAGE: &str = "usage: hako-probe [--apply-default-seccomp | --skip-x32 | --single x32-mount]
  Prints a JSON report of what this process may do (system calls the
  default seccomp policy refuses, capabilities, no_new_privs, seccomp,
  ids, hostname).
  --apply-default-seccomp  set no_new_privs and install the default
                           policy on the probe itself first
  --skip-x32               leave out the x32 call (a runtime's filter
                           kills the process for it)
  --single x32-mount       make only the x32 call and print its outcome
  --steal-guest-fds N      N rounds of killing the guest's idle supervisors
                           and trying the descriptors of their replacements
                           (see hako_probe::steal)
  --catch-forks MS         for MS ms, try the descriptors of every process
                           that appears, killing nothing (says `watching`
                           on stderr once it watches)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(arch) = Arch::native() else {
        eprintln!(
            "hako-probe: unsupported architecture {}",
            std::env::consts::ARCH
        );
        return ExitCode::FAILURE;
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let report = match args.as_slice() {
        [] => hako_probe::report(arch, false),
        ["--apply-default-seccomp"] => {
            if let Err(error) = apply_default_seccomp() {
                eprintln!("hako-probe: {error}");
                return ExitCode::FAILURE;
            }
            hako_probe::report(arch, true)
        }
        ["--skip-x32"] => hako_probe::report_with(arch, false, true),
        ["--single", "x32-mount"] => hako_probe::single_x32_mount(arch),
        ["--single", "unshare-newuser"] => hako_probe::unshare_newuser_here(arch),
        ["--single", "noop"] => return ExitCode::SUCCESS,
        ["--catch-forks", ms] => match ms.parse() {
            Ok(ms) => hako_probe::steal::catch_forks(ms),
            Err(_) => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        },
        ["--steal-guest-fds", rounds] => match rounds.parse() {
            Ok(rounds) => hako_probe::steal::steal_guest_fds(rounds),
            Err(_) => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        },
        ["-h" | "--help"] => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    println!("{report:#}");
    ExitCode::SUCCESS
}

/// Sets `no_new_privs`, then installs the default policy: the order the
/// kernel requires of an unprivileged process.
fn apply_default_seccomp() -> Result<(), String> {
    hako_sys::raw::set_no_new_privs().map_err(|e| format!("cannot set no_new_privs: {e}"))?;
    let program =
        hako_seccomp::compile(&hako_seccomp::default_policy()).map_err(|e| e.to_string())?;
    hako_seccomp::apply(&program).map_err(|e| e.to_string())
}
