//! The confinement applied to a `linux` sandbox's command just before exec.
//!
//! Order, and why:
//! 1. rlimits: plain `setrlimit`, needs nothing.
//! 2. Landlock: restricting itself needs `no_new_privs` or `CAP_SYS_ADMIN`
//!    in the namespace; the command's process still has the latter here.
//! 3. `no_new_privs`: from here on nothing the command execs can gain
//!    privileges (setuid bits, file capabilities).
//! 4. Drop every capability (bounding, ambient, effective, permitted,
//!    inheritable), after the steps above that needed them.
//! 5. seccomp, last: its filter would refuse some of the calls above. In a
//!    `linux` sandbox pid 1 installs the filter on itself once (see
//!    [`Confinement::seal_pid1`]) and every command inherits it; none of the
//!    steps above is refused by it.

use std::io;
use std::sync::Arc;

use hako_sys::confine::{self, LandlockRules, Resource, Rlimit};
use hako_sys::spawn::ConfineHook;

use crate::proto::{LinuxSpec, RlimitResource};

fn resource(r: RlimitResource) -> Resource {
    match r {
        RlimitResource::AddressSpace => Resource::AddressSpace,
        RlimitResource::Nproc => Resource::Nproc,
        RlimitResource::Fsize => Resource::Fsize,
        RlimitResource::Nofile => Resource::Nofile,
        RlimitResource::Core => Resource::Core,
    }
}

fn other(err: impl std::fmt::Display) -> io::Error {
    io::Error::other(err.to_string())
}

/// The confinement of every command of a sandbox, checked and compiled
/// once (Landlock's availability and its ruleset, the seccomp program).
/// Checked in the process that creates pid 1; compiled and built in pid 1.
#[derive(Clone)]
pub(crate) struct Confinement {
    rlimits: Arc<Vec<Rlimit>>,
    /// The write rules and whether they are required, until pid 1 builds
    /// the ruleset from them.
    landlock: Option<Arc<(LandlockRules, bool)>>,
    /// The ruleset, built once by pid 1 inside the view.
    prepared: Option<Arc<confine::PreparedLandlock>>,
    /// The sandbox has a seccomp filter (compiled by
    /// [`Confinement::compile_seccomp`]).
    wants_seccomp: bool,
    seccomp: Option<Arc<hako_seccomp::Program>>,
}

impl Confinement {
    pub(crate) fn new(spec: &LinuxSpec) -> Result<Self, String> {
        let rlimits: Vec<Rlimit> = spec
            .rlimits
            .iter()
            .map(|r| Rlimit::new(resource(r.resource), r.value))
            .collect();
        let landlock = match &spec.landlock {
            Some(ll) if confine::landlock_abi().is_none() => {
                if ll.required {
                    return Err("Landlock is required but this kernel does not offer it; hint: boot with Landlock in the lsm= list, or pass --best-effort to run without it".into());
                }
                None
            }
            Some(ll) => Some(Arc::new((
                LandlockRules {
                    write_paths: ll.write_dirs.clone(),
                    write_files: ll.write_files.clone(),
                },
                ll.required,
            ))),
            None => None,
        };
        Ok(Confinement {
            rlimits: Arc::new(rlimits),
            landlock,
            prepared: None,
            wants_seccomp: spec.seccomp,
            seccomp: None,
        })
    }

    /// Compiles the seccomp program, if the sandbox has one.
    pub(crate) fn compile_seccomp(&mut self) -> Result<(), String> {
        if self.wants_seccomp && self.seccomp.is_none() {
            self.seccomp = Some(Arc::new(
                hako_seccomp::compile(&hako_seccomp::default_policy())
                    .map_err(|e| format!("cannot compile the seccomp policy: {e}"))?,
            ));
        }
        Ok(())
    }

    /// Builds the Landlock ruleset once, in pid 1 after `pivot_root` (its
    /// paths are the sandbox's): each command then enforces it with one
    /// system call. A ruleset that cannot be fully enforced fails the
    /// sandbox here, unless Landlock is not required.
    pub(crate) fn prepare_landlock(&mut self) -> Result<(), String> {
        let Some(ll) = self.landlock.take() else {
            return Ok(());
        };
        let (rules, required) = &*ll;
        match confine::landlock_prepare_writes(rules) {
            Ok(prepared) => self.prepared = Some(Arc::new(prepared)),
            Err(err) if *required => {
                return Err(format!("cannot build the Landlock ruleset: {err}; hint: pass --best-effort to run without it"))
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// The ruleset's descriptor, which every supervisor keeps for its
    /// command.
    pub(crate) fn landlock_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.prepared.as_ref().map(|p| p.fd())
    }

    /// Installs the seccomp filter on pid 1 itself, before it starts any
    /// process: every supervisor and command inherits it (filters survive
    /// fork and exec), so it is compiled and loaded once per sandbox instead
    /// of once per command, and pid 1, which keeps capabilities in the
    /// sandbox's user namespace, is held to it too. Nothing pid 1 does from
    /// here on needs a call the filter refuses; neither do the steps each
    /// command still takes before exec (rlimits, Landlock, no_new_privs,
    /// dropping capabilities). Pid 1 may install it without no_new_privs: it
    /// holds CAP_SYS_ADMIN in the namespace.
    pub(crate) fn seal_pid1(&mut self) -> Result<(), String> {
        self.compile_seccomp()?;
        if let Some(program) = self.seccomp.take() {
            self.wants_seccomp = false;
            hako_seccomp::apply(&program)
                .map_err(|e| format!("cannot install the seccomp filter on pid 1: {e}"))?;
        }
        Ok(())
    }

    /// The step run in one command's process just before exec.
    /// `landlock` is the prepared ruleset's descriptor as the supervisor
    /// holds it (see [`Confinement::landlock_fd`]).
    pub(crate) fn hook(&self, landlock: Option<std::os::fd::OwnedFd>) -> ConfineHook {
        // Only what the step needs: not the prepared ruleset, whose own
        // descriptor number means nothing in a supervisor.
        let this = Confinement {
            rlimits: Arc::clone(&self.rlimits),
            landlock: self.landlock.clone(),
            prepared: None,
            wants_seccomp: false,
            seccomp: self.seccomp.clone(),
        };
        Box::new(move || {
            confine::apply_rlimits(&this.rlimits).map_err(other)?;
            if let Some(fd) = &landlock {
                confine::landlock_restrict_self_with(std::os::fd::AsFd::as_fd(fd))
                    .map_err(other)?;
            } else if let Some(ll) = &this.landlock {
                let (rules, required) = &**ll;
                if let Err(err) = confine::landlock_restrict_writes(rules) {
                    if *required {
                        return Err(other(err));
                    }
                }
            }
            confine::set_no_new_privs().map_err(other)?;
            confine::drop_all_capabilities().map_err(other)?;
            if let Some(program) = &this.seccomp {
                hako_seccomp::apply(program).map_err(other)?;
            }
            Ok(())
        })
    }
}
