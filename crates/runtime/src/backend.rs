//! The closed set of backends, the names that pick one, and `auto`.

use std::fmt;
use std::str::FromStr;

use hako_core::{Error, Isolation};

use crate::probe::Unavailable;

/// A backend as a user names it: `auto` or one backend that can be chosen.
///
/// Parsed from its [`name`](BackendArg::name) with [`FromStr`]; turned
/// into a [`BackendKind`] by [`resolve`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendArg {
    /// The strongest backend that works on this host.
    Auto,
    /// Host processes and the file fence; trusted code only.
    Host,
    /// Linux namespaces, Landlock, seccomp; rootless.
    Linux,
    /// Landlock and seccomp with no namespace and no privilege (inside
    /// unprivileged containers).
    Landlock,
    /// A locked-down Docker or Podman container (the `runsc` runtime for gVisor).
    Docker,
    /// gVisor's runsc, driven directly; no daemon.
    Gvisor,
    /// A virtual machine of its own (QEMU), its kernel the guest's.
    Vm,
}

impl BackendArg {
    /// Every name a user may give, in the order they are listed to them.
    pub const ALL: [BackendArg; 7] = [
        BackendArg::Auto,
        BackendArg::Host,
        BackendArg::Linux,
        BackendArg::Landlock,
        BackendArg::Docker,
        BackendArg::Gvisor,
        BackendArg::Vm,
    ];

    /// The name on the command line and in a profile.
    pub fn name(self) -> &'static str {
        match self.kind() {
            Some(kind) => kind.name(),
            None => "auto",
        }
    }

    /// The backend named, or `None` for `auto`, which only [`resolve`]
    /// can answer.
    pub fn kind(self) -> Option<BackendKind> {
        match self {
            BackendArg::Auto => None,
            BackendArg::Host => Some(BackendKind::Host),
            BackendArg::Linux => Some(BackendKind::Linux),
            BackendArg::Landlock => Some(BackendKind::Landlock),
            BackendArg::Docker => Some(BackendKind::Docker),
            BackendArg::Gvisor => Some(BackendKind::Gvisor),
            BackendArg::Vm => Some(BackendKind::Vm),
        }
    }
}

impl fmt::Display for BackendArg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not one of [`BackendArg::ALL`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseBackendError {
    /// The name as given.
    pub name: String,
}

impl fmt::Display for ParseBackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown backend {:?}; expected one of", self.name)?;
        for (i, arg) in BackendArg::ALL.iter().enumerate() {
            let sep = if i == 0 { " " } else { ", " };
            write!(f, "{sep}{arg}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ParseBackendError {}

impl FromStr for BackendArg {
    type Err = ParseBackendError;

    /// Exact names only, as the command line takes them.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        BackendArg::ALL
            .into_iter()
            .find(|arg| arg.name() == s)
            .ok_or_else(|| ParseBackendError { name: s.into() })
    }
}

/// The backends hako knows, whether or not this build or host can run them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Host processes.
    Host,
    /// Linux namespaces, Landlock, seccomp.
    Linux,
    /// Landlock, seccomp, no namespace.
    Landlock,
    /// A Docker or Podman container.
    Docker,
    /// gVisor's runsc.
    Gvisor,
    /// A KVM microVM.
    Vm,
}

impl BackendKind {
    /// Every backend, strongest first: the order `auto` tries them in
    /// (all but `host`, which `auto` never picks).
    pub const ALL: [BackendKind; 6] = [
        BackendKind::Vm,
        BackendKind::Gvisor,
        BackendKind::Docker,
        BackendKind::Linux,
        BackendKind::Landlock,
        BackendKind::Host,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Linux => "linux",
            BackendKind::Landlock => "landlock",
            BackendKind::Docker => "docker",
            BackendKind::Gvisor => "gvisor",
            BackendKind::Vm => "vm",
        }
    }

    /// The isolation the backend provides when it works.
    pub fn isolation(self) -> Isolation {
        match self {
            BackendKind::Host => Isolation::None,
            BackendKind::Linux | BackendKind::Landlock | BackendKind::Docker => Isolation::Process,
            BackendKind::Gvisor => Isolation::Kernel,
            BackendKind::Vm => Isolation::Vm,
        }
    }

    /// The isolation the backend provides under the OCI `runtime` the spec
    /// names: `docker` with gVisor's `runsc` gives `kernel`, as its
    /// sandboxes report once open (where it is checked again).
    pub fn isolation_under(self, runtime: Option<&str>) -> Isolation {
        if self == BackendKind::Docker && hako_docker::is_gvisor_runtime(runtime) {
            Isolation::Kernel
        } else {
            self.isolation()
        }
    }

    /// The policy gate, before anything starts: refuses a backend whose
    /// isolation is weaker than `required`.
    pub fn require_isolation(self, required: Isolation) -> Result<(), Error> {
        self.require_isolation_under(required, None)
    }

    /// [`require_isolation`](Self::require_isolation) under the OCI
    /// `runtime` the spec names (see [`isolation_under`](Self::isolation_under)).
    pub fn require_isolation_under(
        self,
        required: Isolation,
        runtime: Option<&str>,
    ) -> Result<(), Error> {
        let actual = self.isolation_under(runtime);
        if actual < required {
            return Err(Error::IsolationTooWeak {
                required,
                actual,
                backend: self.name().into(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The backend `arg` names; for `auto`, the strongest one that works on
/// this host ([`choose_auto`]). A backend named explicitly is not probed
/// here: it says why it cannot run when it is opened.
pub fn resolve(arg: BackendArg) -> Result<BackendKind, Error> {
    match arg.kind() {
        Some(kind) => Ok(kind),
        None => choose_auto().map(|choice| choice.kind),
    }
}

/// What `auto` picked, and the stronger backends it passed over, each
/// with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoChoice {
    /// The backend picked.
    pub kind: BackendKind,
    /// The stronger backends that do not work here (or fail everyday
    /// tools), strongest first.
    pub passed_over: Vec<(BackendKind, Unavailable)>,
}

impl AutoChoice {
    /// Short: what was picked, and the names of the stronger ones passed
    /// over (their reasons are [`AutoChoice::why`]'s).
    pub fn summary(&self) -> String {
        let mut line = format!(
            "{}: the strongest isolating backend that works here",
            self.kind
        );
        if !self.passed_over.is_empty() {
            let names: Vec<&str> = self.passed_over.iter().map(|(k, _)| k.name()).collect();
            line.push_str(&format!(" ({} did not)", names.join(", ")));
        }
        line
    }

    /// One line: what was picked, and why not each stronger one.
    pub fn why(&self) -> String {
        let mut why = format!(
            "{} is the strongest isolating backend that works here",
            self.kind
        );
        for (i, (kind, unavailable)) in self.passed_over.iter().enumerate() {
            why.push_str(if i == 0 { "; not " } else { "; nor " });
            why.push_str(&format!("{kind}: {}", unavailable.reason));
        }
        why
    }
}

/// `auto`: the first of [`BackendKind::ALL`] but `host` that works here
/// ([`crate::probe_for_auto`]: it opens, and runs everyday tools), or the
/// refusal naming `hako doctor`. `auto` never picks `host`, which isolates
/// nothing.
pub fn choose_auto() -> Result<AutoChoice, Error> {
    choose_auto_with(crate::probe::probe_for_auto)
}

/// `auto`'s choice with `works` the test of each backend (`hako doctor`
/// passes its own, thorough one): the first of [`BackendKind::ALL`] but
/// `host` that `works`.
pub fn choose_auto_with(
    works: impl Fn(BackendKind) -> Result<(), Unavailable>,
) -> Result<AutoChoice, Error> {
    let mut passed_over = Vec::new();
    for kind in BackendKind::ALL {
        if kind == BackendKind::Host {
            break;
        }
        match works(kind) {
            Ok(()) => return Ok(AutoChoice { kind, passed_over }),
            Err(why) => passed_over.push((kind, why)),
        }
    }
    Err(Error::Backend {
        backend: "auto".into(),
        op: "pick a backend",
        message: "no isolating backend works on this host (auto never picks host, which isolates nothing; name it with --backend host for trusted code); run `hako doctor` for reasons".into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_backend_name_parses_back_to_itself() {
        for arg in BackendArg::ALL {
            assert_eq!(arg.name().parse::<BackendArg>(), Ok(arg));
            assert_eq!(arg.to_string(), arg.name());
        }
        let names: Vec<_> = BackendArg::ALL.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            ["auto", "host", "linux", "landlock", "docker", "gvisor", "vm"]
        );
    }

    #[test]
    fn an_unknown_or_miscased_name_is_refused_with_the_names_that_exist() {
        for bad in ["bogus", "Linux", "lin", "", "VM"] {
            let err = bad.parse::<BackendArg>().unwrap_err();
            assert_eq!(err.name, bad);
            assert_eq!(
                err.to_string(),
                format!(
                    "unknown backend {bad:?}; expected one of auto, host, linux, landlock, docker, gvisor, vm"
                )
            );
        }
    }

    #[test]
    fn a_named_backend_resolves_to_itself_without_probing() {
        for arg in BackendArg::ALL
            .into_iter()
            .filter(|a| *a != BackendArg::Auto)
        {
            let kind = resolve(arg).unwrap();
            assert_eq!(kind.name(), arg.name());
            assert_eq!(arg.kind(), Some(kind));
        }
        assert_eq!(BackendArg::Auto.kind(), None);
    }

    #[test]
    fn auto_picks_the_strongest_backend_that_works() {
        let works = |kind| match kind {
            BackendKind::Docker | BackendKind::Host => Ok(()),
            _ => Err(Unavailable {
                reason: "no".into(),
                hint: "none".into(),
            }),
        };
        let choice = choose_auto_with(works).unwrap();
        assert_eq!(choice.kind, BackendKind::Docker);
        let passed: Vec<_> = choice.passed_over.iter().map(|(k, _)| *k).collect();
        assert_eq!(passed, [BackendKind::Vm, BackendKind::Gvisor]);
        assert_eq!(
            choice.why(),
            "docker is the strongest isolating backend that works here; not vm: no; nor gvisor: no"
        );
    }

    #[test]
    fn auto_picks_landlock_where_only_it_and_host_work_and_never_host() {
        let only = |ok: &'static [BackendKind]| {
            move |kind| {
                if ok.contains(&kind) {
                    Ok(())
                } else {
                    Err(Unavailable {
                        reason: "no".into(),
                        hint: "none".into(),
                    })
                }
            }
        };
        assert_eq!(
            choose_auto_with(only(&[BackendKind::Landlock, BackendKind::Host]))
                .unwrap()
                .kind,
            BackendKind::Landlock
        );
        assert_eq!(
            choose_auto_with(only(&[BackendKind::Linux, BackendKind::Landlock]))
                .unwrap()
                .kind,
            BackendKind::Linux
        );
        let err = choose_auto_with(only(&[BackendKind::Host])).unwrap_err();
        assert!(err.to_string().contains("auto never picks host"), "{err}");
    }

    #[test]
    fn auto_with_nothing_working_points_at_hako_doctor() {
        let err = choose_auto_with(|_| {
            Err(Unavailable {
                reason: "no".into(),
                hint: "none".into(),
            })
        })
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "auto backend: pick a backend: no isolating backend works on this host (auto never picks host, which isolates nothing; name it with --backend host for trusted code); run `hako doctor` for reasons"
        );
    }

    #[test]
    fn backends_are_listed_strongest_first() {
        let levels: Vec<_> = BackendKind::ALL.iter().map(|k| k.isolation()).collect();
        assert!(levels.windows(2).all(|w| w[0] >= w[1]), "{levels:?}");
        assert_eq!(BackendKind::ALL.last(), Some(&BackendKind::Host));
    }

    #[test]
    fn a_backend_weaker_than_required_is_refused_before_it_starts() {
        assert!(BackendKind::Linux
            .require_isolation(Isolation::Process)
            .is_ok());
        let err = BackendKind::Host
            .require_isolation(Isolation::Process)
            .unwrap_err();
        assert!(
            matches!(
                &err,
                Error::IsolationTooWeak { required: Isolation::Process, actual: Isolation::None, backend }
                    if backend == "host"
            ),
            "{err:?}"
        );
    }
}
