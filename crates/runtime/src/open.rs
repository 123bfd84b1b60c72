//! Turning a spec into a backend's configuration and opening it.

use std::path::PathBuf;
use std::sync::Arc;

use hako_core::{Error, Isolation, Sandbox};
use hako_driver::LaunchOptions;

use crate::bounded::Bounded;
use crate::cow::{CowHold, CowRequest, StateError};
use crate::{resolve, BackendArg, BackendKind, DriverOptions, Plan, SandboxSpec};

/// A backend chosen for a spec and gated by the isolation required: what a
/// front end opens its sandboxes from (the one `hako mcp` opens on the
/// first tool call, each one a `hako serve` client asks for).
///
/// With a copy-on-write workspace ([`Opener::from_plan`] of a plan that
/// asks for one), each sandbox is opened on layers ([`Opener::hold`]) it
/// holds until it is dropped: [`Opener::open`] makes them for it (the
/// named sandbox of the request, or a temporary layer of its own), and
/// [`Opener::open_on`] opens one on layers a front end keeps (to review
/// them, or to open another sandbox on them after a rollback).
#[derive(Debug, Clone)]
pub struct Opener {
    kind: BackendKind,
    spec: SandboxSpec,
    min_isolation: Isolation,
    cow: Option<CowRequest>,
}

impl Opener {
    /// Resolves `backend` (`auto` probes the host) and refuses, before
    /// anything starts, a backend weaker than `min_isolation` or than the
    /// spec's own [`min_isolation`](SandboxSpec::min_isolation), whichever
    /// is stronger.
    pub fn new(
        backend: BackendArg,
        spec: SandboxSpec,
        min_isolation: Isolation,
    ) -> Result<Self, Error> {
        let min_isolation = min_isolation.max(spec.min_isolation);
        let kind = resolve(backend)?;
        kind.require_isolation_under(min_isolation, spec.runtime.as_deref())?;
        Ok(Opener {
            kind,
            spec,
            min_isolation,
            cow: None,
        })
    }

    /// [`Opener::new`] for what the flags and profile describe, with the
    /// copy-on-write workspace they ask for (`auto` is then `linux`: see
    /// [`Plan::backend`]).
    pub fn from_plan(plan: Plan, min_isolation: Isolation) -> Result<Self, Error> {
        let kind = resolve(plan.backend())?;
        Opener::with_kind(kind, plan, min_isolation)
    }

    /// [`Opener::from_plan`] on a backend already resolved (from
    /// [`Plan::backend`]): refuses, before anything starts, one weaker
    /// than `min_isolation` or the spec's own.
    pub fn with_kind(
        kind: BackendKind,
        plan: Plan,
        min_isolation: Isolation,
    ) -> Result<Self, Error> {
        let min_isolation = min_isolation.max(plan.spec.min_isolation);
        kind.require_isolation_under(min_isolation, plan.spec.runtime.as_deref())?;
        if kind == BackendKind::Host && plan.cow.is_some() {
            // Refused before any layer is made: the host backend has no
            // boundary to mount a view in.
            let mut spec = plan.spec.clone();
            spec.cow = Some(hako_core::CowLayers {
                upper: PathBuf::new(),
                work: PathBuf::new(),
            });
            spec.refuse_cow(kind.name())?;
        }
        Ok(Opener {
            kind,
            spec: plan.spec,
            min_isolation,
            cow: plan.cow,
        })
    }

    /// The copy-on-write workspace asked for, if one is.
    pub fn cow(&self) -> Option<&CowRequest> {
        self.cow.as_ref()
    }

    /// The layers of one sandbox, when a copy-on-write workspace is asked
    /// for: the named sandbox `name` (or, without one, the request's
    /// name), locked while held, or a temporary layer removed when the
    /// last holder drops it. `None` without `--cow`.
    pub fn hold(&self, name: Option<&str>) -> Result<Option<Arc<CowHold>>, Error> {
        self.hold_layers(name).map_err(|e| Error::Backend {
            backend: self.kind.name().into(),
            op: "hold the copy-on-write layers",
            message: e.to_string(),
        })
    }

    /// [`Opener::hold`], its failure as the state directory's (a name
    /// refused, in use, ...).
    pub fn hold_layers(&self, name: Option<&str>) -> Result<Option<Arc<CowHold>>, StateError> {
        let Some(request) = &self.cow else {
            return Ok(None);
        };
        let name = name.or(request.name.as_deref());
        CowHold::open(request, name, &self.spec).map(|hold| Some(Arc::new(hold)))
    }

    /// The backend chosen.
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// The isolation every sandbox must have.
    pub fn min_isolation(&self) -> Isolation {
        self.min_isolation
    }

    /// The spec every sandbox is opened with.
    pub fn spec(&self) -> &SandboxSpec {
        &self.spec
    }

    /// Opens one sandbox, and refuses it (closed again) if what it
    /// enforces here is weaker than required. With `--cow`, on layers of
    /// its own ([`Opener::hold`]), which it holds.
    pub fn open(&self) -> Result<Box<dyn Sandbox>, Error> {
        self.open_on(self.hold(None)?, &DriverOptions::default())
    }

    /// Opens one sandbox as [`Opener::open`] does, on `workspace` in place
    /// of the spec's (`hako serve --e2b` gives each sandbox a workspace of
    /// its own). Refused with a copy-on-write workspace.
    pub fn open_in(&self, workspace: &std::path::Path) -> Result<Box<dyn Sandbox>, Error> {
        if self.cow.is_some() {
            return Err(Error::Backend {
                backend: self.kind.name().into(),
                op: "open",
                message: "a sandbox in a workspace of its own cannot also be copy-on-write".into(),
            });
        }
        let mut spec = self.spec.clone();
        spec.workspace = workspace.to_path_buf();
        let sandbox = open_held(self.kind, &spec, &DriverOptions::default(), None)?;
        if let Err(e) = hako_core::require_isolation(sandbox.as_ref(), self.min_isolation) {
            let _ = sandbox.close();
            return Err(e);
        }
        Ok(sandbox)
    }

    /// Opens one sandbox on `layers` (from [`Opener::hold`]; `None`
    /// without `--cow`), with the driver reading and closing it as
    /// `driver` says. The sandbox holds the layers until it is dropped.
    pub fn open_on(
        &self,
        layers: Option<Arc<CowHold>>,
        driver: &DriverOptions,
    ) -> Result<Box<dyn Sandbox>, Error> {
        if self.cow.is_some() && layers.is_none() {
            // Fail closed: never the workspace itself in their place.
            return Err(Error::Backend {
                backend: self.kind.name().into(),
                op: "open",
                message: "a copy-on-write workspace was asked for and no layers were given".into(),
            });
        }
        let mut spec = self.spec.clone();
        spec.cow = layers.as_ref().map(|l| l.layers());
        let sandbox = open_held(self.kind, &spec, driver, layers)?;
        if let Err(e) = hako_core::require_isolation(sandbox.as_ref(), self.min_isolation) {
            let _ = sandbox.close();
            return Err(e);
        }
        Ok(sandbox)
    }
}

/// Opens a sandbox of `kind` as `spec` describes.
///
/// A setting `kind` has no use for (`runtime`, `no_guest` and `image` off
/// the backends that take them; limits or binds on `host`) is refused here,
/// before anything starts, rather than ignored.
pub fn open(kind: BackendKind, spec: &SandboxSpec) -> Result<Box<dyn Sandbox>, Error> {
    open_with(kind, spec, &DriverOptions::default())
}

/// [`open`], with the driver reading and closing the sandbox as `driver`
/// says (a one-command `hako run`: see [`DriverOptions::one_shot`]).
pub fn open_with(
    kind: BackendKind,
    spec: &SandboxSpec,
    driver: &DriverOptions,
) -> Result<Box<dyn Sandbox>, Error> {
    open_held(kind, spec, driver, None)
}

/// [`open_with`], the sandbox holding `layers` until it is dropped (after
/// the backend's own sandbox, so a temporary layer is removed only once
/// nothing is mounted on it).
fn open_held(
    kind: BackendKind,
    spec: &SandboxSpec,
    driver: &DriverOptions,
    layers: Option<Arc<CowHold>>,
) -> Result<Box<dyn Sandbox>, Error> {
    let sandbox = open_backend(kind, spec, driver)?;
    // Every sandbox bounds the sessions and processes a client can make
    // it hold at once.
    Ok(Box::new(
        Bounded::new(sandbox, spec.max_sessions, spec.max_processes).holding(layers),
    ))
}

/// The backend's own sandbox, unbounded.
fn open_backend(
    kind: BackendKind,
    spec: &SandboxSpec,
    driver: &DriverOptions,
) -> Result<Box<dyn Sandbox>, Error> {
    refuse_unused(kind, spec)?;
    let launch = LaunchOptions {
        driver: driver.clone(),
        ..LaunchOptions::default()
    };
    match kind {
        BackendKind::Host => {
            let mut config = hako_host::HostConfig::from_spec(spec.clone());
            config.launch = launch;
            Ok(Box::new(hako_host::HostSandbox::new(config)?))
        }
        BackendKind::Linux => {
            let mut config = hako_linux::LinuxConfig::from_spec(spec.clone());
            config.launch = launch;
            Ok(Box::new(hako_linux::LinuxSandbox::new(config)?))
        }
        BackendKind::Landlock => {
            let mut config = hako_landlock::LandlockConfig::from_spec(spec.clone());
            config.launch = launch;
            Ok(Box::new(hako_landlock::LandlockSandbox::new(config)?))
        }
        BackendKind::Docker => {
            let mut config = hako_docker::DockerConfig::from_spec(spec.clone());
            config.launch = launch;
            if spec.no_guest {
                return Ok(Box::new(hako_docker::DockerExecSandbox::new(config)?));
            }
            Ok(Box::new(hako_docker::DockerSandbox::new(config)?))
        }
        BackendKind::Gvisor => {
            let mut config = hako_gvisor::GvisorConfig::from_spec(spec.clone());
            config.launch = launch;
            Ok(Box::new(hako_gvisor::GvisorSandbox::new(config)?))
        }
        BackendKind::Vm => {
            let mut config = hako_vm::VmConfig::from_spec(spec.clone());
            config.launch = launch;
            Ok(Box::new(hako_vm::VmSandbox::new(config)?))
        }
    }
}

/// Refuses what `spec` asks of `kind` that `kind` cannot do; pure.
fn refuse_unused(kind: BackendKind, spec: &SandboxSpec) -> Result<(), Error> {
    let refuse = |what: &str, which: &str| Error::Backend {
        backend: kind.name().into(),
        op: "open",
        message: format!(
            "{what} applies only to {which}; the {} backend has none",
            kind.name()
        ),
    };
    if spec.runtime.is_some() && kind != BackendKind::Docker {
        return Err(refuse("--runtime", "--backend docker"));
    }
    if spec.no_guest && kind != BackendKind::Docker {
        return Err(refuse("--no-guest", "--backend docker"));
    }
    if spec.image.is_some() && !matches!(kind, BackendKind::Docker | BackendKind::Gvisor) {
        return Err(refuse("--image", "--backend docker and gvisor"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn refusal(kind: BackendKind, spec: &SandboxSpec) -> String {
        match open(kind, spec) {
            Ok(_) => panic!("{kind} opened"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn flags_of_another_backend_are_refused_before_anything_starts() {
        let mut spec = SandboxSpec::new("/nonexistent/ws".into());
        spec.runtime = Some("runsc".into());
        assert_eq!(
            refusal(BackendKind::Linux, &spec),
            "linux backend: open: --runtime applies only to --backend docker; the linux backend has none"
        );
        let mut spec = SandboxSpec::new("/nonexistent/ws".into());
        spec.no_guest = true;
        assert_eq!(
            refusal(BackendKind::Gvisor, &spec),
            "gvisor backend: open: --no-guest applies only to --backend docker; the gvisor backend has none"
        );
        let mut spec = SandboxSpec::new("/nonexistent/ws".into());
        spec.image = Some("alpine".into());
        assert_eq!(
            refusal(BackendKind::Host, &spec),
            "host backend: open: --image applies only to --backend docker and gvisor; the host backend has none"
        );
        assert!(refuse_unused(BackendKind::Docker, &spec).is_ok());
        assert!(refuse_unused(BackendKind::Gvisor, &spec).is_ok());
    }

    #[test]
    fn the_host_backend_refuses_limits_and_binds_it_cannot_enforce() {
        let host_refusal = "host backend: open: the host backend cannot enforce --memory, --pids, --cpus, --max-file-size, --max-open-files, --ro or --rw; use --backend linux (or --best-effort to run without the limits)";
        let mut spec = SandboxSpec::new("/nonexistent/ws".into());
        spec.limits.memory = Some(1 << 20);
        assert_eq!(refusal(BackendKind::Host, &spec), host_refusal);
        // Limits may be dropped by name; binds never.
        spec.best_effort = true;
        assert!(refuse_unused(BackendKind::Host, &spec).is_ok());
        spec.rw = vec!["/tmp".into()];
        assert_eq!(refusal(BackendKind::Host, &spec), host_refusal);
        let mut spec = SandboxSpec::new("/nonexistent/ws".into());
        spec.ro = vec!["/usr".into()];
        spec.best_effort = true;
        assert_eq!(refusal(BackendKind::Host, &spec), host_refusal);
        // The isolating backends take them.
        assert!(refuse_unused(BackendKind::Linux, &spec).is_ok());
    }
}
