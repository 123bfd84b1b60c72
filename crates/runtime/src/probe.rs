//! Asking the host which backends work, and why the others do not.

use std::fmt;

use hako_core::Command;
use serde::Serialize;

use crate::{open, BackendKind, SandboxSpec};

/// Why a backend cannot be used here, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// What is missing or failed.
    pub reason: String,
    /// What the user can do about it.
    pub hint: String,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; hint: {}", self.reason, self.hint)
    }
}

impl std::error::Error for Unavailable {}

/// Whether a backend can be opened on this host, without opening one:
/// the cheap test `auto` makes of each backend in turn.
pub fn probe(kind: BackendKind) -> Result<(), Unavailable> {
    match kind {
        // The CLI runs the guest's code in a fork of itself (see
        // `hako_driver::connection::Connection::start`): no helper binary needed.
        BackendKind::Host => Ok(()),
        BackendKind::Linux => hako_sys::ns::user_namespaces_allowed().map_err(|why| {
            let (reason, hint) = split_hint(&why);
            Unavailable {
                reason: format!("user namespaces are not available: {reason}"),
                hint: hint.unwrap_or("enable unprivileged user namespaces, or use --backend landlock").into(),
            }
        }),
        BackendKind::Landlock => hako_landlock::ready(false).map_err(|reason| Unavailable {
            reason,
            hint: "use a kernel with Landlock ABI 6 (Linux 6.12) or later, or --backend landlock --best-effort to run without scoped signals".into(),
        }),
        BackendKind::Docker => hako_docker::readiness(hako_docker::DEFAULT_IMAGE, None)
            .map_err(|n| Unavailable {
                reason: n.reason,
                hint: n.hint,
            }),
        BackendKind::Gvisor => {
            hako_gvisor::readiness().map_err(|n| Unavailable {
                reason: n.reason,
                hint: n.hint,
            })?;
            // runsc re-executes itself in a user namespace and mounts its
            // own /proc: inside a container that refuses the first (and
            // masks /proc), it cannot start.
            if hako_sys::ns::in_container() && hako_sys::ns::user_namespaces_allowed().is_err() {
                return Err(Unavailable {
                    reason: "runsc cannot start inside this container: its seccomp filter (Docker's default profile) refuses the user namespace runsc runs in, and the container's masked /proc keeps runsc from mounting its own".into(),
                    hint: "run the outer container with --security-opt seccomp=unconfined --security-opt systempaths=unconfined, or use --backend landlock".into(),
                });
            }
            Ok(())
        }
        BackendKind::Vm => {
            hako_vm::readiness().map_err(|n| Unavailable {
                reason: n.reason,
                hint: n.hint,
            })?;
            // An emulated VM is no hardware boundary (QEMU's security
            // policy does not count TCG as one): never chosen by `auto`,
            // run only when named.
            let detected = hako_vm::accel::detect();
            if !detected.accel.is_hardware() {
                return Err(Unavailable {
                    reason: format!(
                        "only emulated here (accelerator tcg): {}",
                        detected.why.unwrap_or_default()
                    ),
                    hint: "name it with --backend vm (and --allow-emulated-vm for --min-isolation vm) to run it emulated, slowly".into(),
                });
            }
            Ok(())
        }
    }
}

/// What a server (`hako mcp`, `hako serve`) checks before it starts, so
/// that what its backend needs is said at once rather than at the first
/// call: [`probe`], the guest the local backends start (a `hako-guest`, or
/// this executable when it carries the guest), and the image `spec` names
/// (an engine's image for `docker`, a root directory for `gvisor`). The
/// default docker image is built here when missing (see
/// `hako_container::image::ensure_default`).
pub fn preflight(kind: BackendKind, spec: &SandboxSpec) -> Result<(), Unavailable> {
    match kind {
        BackendKind::Host | BackendKind::Linux | BackendKind::Landlock => {
            probe(kind)?;
            let guest = hako_driver::connection::locate_guest().map_err(|e| {
                let text = e.to_string();
                let (reason, hint) = split_hint(&text);
                Unavailable {
                    reason: reason.into(),
                    hint: hint
                        .unwrap_or("install hako-guest next to hako, or set HAKO_GUEST")
                        .into(),
                }
            })?;
            if !guest.is_file() {
                return Err(Unavailable {
                    reason: format!("the guest {} is not a file", guest.display()),
                    hint: "set HAKO_GUEST to the hako-guest binary, or unset it to use the one beside hako".into(),
                });
            }
            Ok(())
        }
        BackendKind::Docker => {
            let image = spec
                .image
                .clone()
                .unwrap_or_else(|| hako_docker::DEFAULT_IMAGE.into());
            hako_docker::readiness(&image, spec.runtime.as_deref()).map_err(|n| Unavailable {
                reason: n.reason,
                hint: n.hint,
            })?;
            if spec.image.is_none() {
                let engine = hako_container::engine::shared(&hako_container::runner::CliRunner)
                    .map_err(|e| Unavailable {
                        reason: e.to_string(),
                        hint: "install Docker or podman".into(),
                    })?;
                hako_container::image::ensure_default(
                    &engine,
                    &hako_container::runner::CliRunner,
                    &image,
                )
                .map_err(|e| Unavailable {
                    reason: e.to_string(),
                    hint: "run `hako image build` to see each step".into(),
                })?;
            }
            Ok(())
        }
        BackendKind::Gvisor => {
            probe(kind)?;
            if let Some(image) = &spec.image {
                if !std::path::Path::new(image).is_dir() {
                    return Err(Unavailable {
                        reason: format!("the gvisor image {image} is not a directory"),
                        hint: "give --image a root file system directory (`hako image build --dir DIR` writes one)".into(),
                    });
                }
            }
            Ok(())
        }
        BackendKind::Vm => probe(kind),
    }
}

/// "reason; hint: hint" split in two.
fn split_hint(text: &str) -> (&str, Option<&str>) {
    split_hint_at(text, "; hint: ")
}

/// `text` split at the last `at`.
fn split_hint_at<'a>(text: &'a str, at: &str) -> (&'a str, Option<&'a str>) {
    match text.rsplit_once(at) {
        Some((reason, hint)) => (reason, Some(hint)),
        None => (text, None),
    }
}

/// [`probe`], and what `auto` asks beyond it ([`fit_for_auto`]).
pub fn probe_for_auto(kind: BackendKind) -> Result<(), Unavailable> {
    probe(kind)?;
    fit_for_auto(kind)
}

/// What `auto` asks of a backend that works: that it runs everyday tools
/// here (a gVisor whose `stat` fails is passed over).
pub fn fit_for_auto(kind: BackendKind) -> Result<(), Unavailable> {
    if kind == BackendKind::Gvisor {
        hako_gvisor::everyday_tools_work().map_err(|why| {
            let (reason, hint) = split_hint_at(&why, ": install");
            Unavailable {
                reason: reason.into(),
                hint: hint.map_or_else(
                    || "install a newer runsc, or name it with --backend gvisor where what fails does not matter".into(),
                    |h| format!("install{h}"),
                ),
            }
        })?;
    }
    Ok(())
}

/// Whether a backend works here, the thorough way: [`probe`]s it, then
/// opens a sandbox of it with defaults in a temporary workspace and runs
/// `true` there. This starts a real sandbox (seconds for the container
/// backends); `hako doctor` runs it for every backend.
pub fn check(kind: BackendKind) -> Result<(), Unavailable> {
    probe(kind)?;
    let unavailable = |e: &dyn fmt::Display| Unavailable {
        reason: e.to_string(),
        hint: "run with HAKO_LOG=debug for details".into(),
    };
    let dir = std::env::temp_dir().join(format!("hako-doctor-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| unavailable(&e))?;
    let spec = SandboxSpec::new(dir.clone());
    let result = open(kind, &spec).and_then(|sb| {
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Protection {
    /// Its name: `landlock`, `seccomp`, `user namespaces`.
    pub name: &'static str,
    /// Whether this kernel offers it to this process.
    pub available: bool,
    /// The version found, or why it is missing.
    pub detail: String,
}

/// Checks each protection the `linux` backend applies. Installing a
/// seccomp filter is tried on a thread of its own, which then ends, so the
/// caller is left unfiltered.
pub fn protections() -> Vec<Protection> {
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_host_backend_needs_nothing_from_the_host() {
        assert_eq!(probe(BackendKind::Host), Ok(()));
    }

    #[test]
    fn every_protection_is_reported_by_name() {
        let names: Vec<_> = protections().iter().map(|p| p.name).collect();
        assert_eq!(names, ["landlock", "seccomp", "user namespaces"]);
    }
}
