//! The confinement of a `linux` sandbox's commands, and of a `landlock`
//! sandbox's ([`Confinement::shared`]: no namespace; a ruleset over the
//! whole filesystem, the default seccomp policy on the guest itself, and a
//! second filter in each supervisor, after step 3 below).
//!
//! Order, and why:
//! 0. seccomp, before anything: pid 1 loads the filter on itself once (see
//!    [`Confinement::seal_pid1`]) and every supervisor and command inherits
//!    it; none of the steps below is refused by it.
//! 1. Landlock: the ruleset pid 1 built, enforced with one call by each
//!    supervisor when it starts, before it is given a command (it sets
//!    `no_new_privs` first, as the kernel requires). The supervisor has
//!    made itself not dumpable just before, while it still held pid 1's
//!    capabilities.
//! 2. `no_new_privs`: from here on nothing the supervisor or its commands
//!    exec can gain privileges (setuid bits, file capabilities).
//! 3. Drop every capability (bounding, ambient, effective, permitted,
//!    inheritable) in the supervisor. Steps 1 to 3 are inherited by every
//!    command it starts ([`Confinement::confine_supervisor`]).
//! 4. rlimits: plain `setrlimit` in each command's process just before
//!    exec ([`Confinement::rlimits`]).

use std::sync::Arc;

use hako_sys::confine::{self, LandlockRules, Resource, Rlimit};

use crate::error::failed;
use crate::proto::{ConfineSpec, LinuxSpec, RlimitResource, RlimitSpec};
use crate::GuestError;

fn resource(r: RlimitResource) -> Resource {
    match r {
        RlimitResource::AddressSpace => Resource::AddressSpace,
        RlimitResource::Nproc => Resource::Nproc,
        RlimitResource::Fsize => Resource::Fsize,
        RlimitResource::Nofile => Resource::Nofile,
        RlimitResource::Core => Resource::Core,
    }
}

/// The default seccomp policy, compiled for this machine (every guest that
/// installs a filter installs this one: a `linux` sandbox's pid 1, a
/// sealed container guest).
pub(crate) fn default_seccomp() -> Result<hako_seccomp::Program, GuestError> {
    hako_seccomp::compile(&hako_seccomp::default_policy())
        .map_err(failed("compile the seccomp policy"))
}

/// The confinement of every command of a sandbox, checked and compiled
/// once: checked and compiled in the process that creates pid 1
/// (Landlock's availability; the seccomp program, which pid 1 loads on
/// itself), then built in pid 1 (the Landlock ruleset, whose descriptor
/// each supervisor keeps for its command).
pub(crate) struct Confinement {
    rlimits: Arc<Vec<Rlimit>>,
    /// The write rules and whether they are required, until pid 1 builds
    /// the ruleset from them.
    landlock: Option<(LandlockRules, bool)>,
    /// The ruleset, built once by pid 1 inside the view.
    prepared: Option<confine::PreparedLandlock>,
    /// The sandbox has a seccomp filter that pid 1 has not loaded yet.
    wants_seccomp: bool,
    /// Its program, once compiled.
    seccomp: Option<hako_seccomp::Program>,
    /// A second filter each supervisor installs on itself, on top of the
    /// inherited one: what commands sharing the host's namespaces must
    /// not reach through them (`landlock`).
    shared: Option<hako_seccomp::Program>,
}

fn rlimits_of(specs: &[RlimitSpec]) -> Vec<Rlimit> {
    specs
        .iter()
        .map(|r| Rlimit::new(resource(r.resource), r.value))
        .collect()
}

impl Confinement {
    pub(crate) fn new(spec: &LinuxSpec) -> Result<Self, GuestError> {
        let rlimits = rlimits_of(&spec.rlimits);
        let landlock = match &spec.landlock {
            Some(ll) if confine::landlock_abi().is_none() => {
                if ll.required {
                    return Err(GuestError::Unmet {
                        requirement: "Landlock is required but this kernel does not offer it",
                        hint: "boot with Landlock in the lsm= list, or pass --best-effort to run without it",
                    });
                }
                None
            }
            Some(ll) => Some((
                LandlockRules {
                    write_paths: ll.write_dirs.clone(),
                    write_files: ll.write_files.clone(),
                },
                ll.required,
            )),
            None => None,
        };
        Ok(Confinement {
            rlimits: Arc::new(rlimits),
            landlock,
            prepared: None,
            wants_seccomp: spec.seccomp,
            seccomp: None,
            shared: None,
        })
    }

    /// The confinement of commands with no namespace of their own (the
    /// `landlock` backend), built by the guest before it serves: the
    /// Landlock ruleset over the whole filesystem (and TCP and scopes
    /// where the kernel has them), the default seccomp policy (for the
    /// guest itself, [`Confinement::seal_guest`]), and the filter that
    /// refuses the network and IPC the shared namespaces would reach.
    /// Landlock is required: a kernel without it, or without a part the
    /// spec requires, fails here, naming it.
    pub(crate) fn shared(spec: &ConfineSpec) -> Result<Self, GuestError> {
        let policy = confine::LandlockPolicy {
            read: spec.read.clone(),
            list: spec.list.clone(),
            write: spec.write.clone(),
            devices: spec.devices.clone(),
            tcp_connect: (!spec.host_network).then(Vec::new),
            scoped: spec.scoped,
        };
        let (prepared, status) =
            confine::landlock_prepare_policy(&policy).map_err(|err| GuestError::FailedWithHint {
                op: "build the Landlock ruleset",
                hint: match err {
                    confine::ConfineError::LandlockUnsupported(_) => {
                        "the landlock backend needs Landlock (Linux 5.13 or later, `landlock` in the lsm= list); use another backend"
                    }
                    _ => "run `hako doctor` to see what this kernel offers",
                }
                .into(),
                source: err.into(),
            })?;
        let shared = hako_seccomp::compile(&hako_seccomp::shared_namespace_policy(
            hako_seccomp::SharedPolicy {
                network: spec.host_network,
                unix_sockets: status.unix_connect,
            },
        ))
        .map_err(failed("compile the seccomp policy"))?;
        Ok(Confinement {
            rlimits: Arc::new(rlimits_of(&spec.rlimits)),
            landlock: None,
            prepared: Some(prepared),
            wants_seccomp: true,
            seccomp: None,
            shared: Some(shared),
        })
    }

    /// [`Confinement::seal_pid1`] for a guest that holds no privilege (the
    /// `landlock` backend's, a process of the host): `no_new_privs` first,
    /// which the kernel requires for a filter without `CAP_SYS_ADMIN`.
    pub(crate) fn seal_guest(&mut self) -> Result<(), GuestError> {
        confine::set_no_new_privs().map_err(failed("set no_new_privs"))?;
        self.seal_pid1()
    }

    /// Compiles the seccomp program, if the sandbox has one.
    pub(crate) fn compile_seccomp(&mut self) -> Result<(), GuestError> {
        if self.wants_seccomp && self.seccomp.is_none() {
            self.seccomp = Some(default_seccomp()?);
        }
        Ok(())
    }

    /// Builds the Landlock ruleset once, in pid 1 after `pivot_root` (its
    /// paths are the sandbox's): each command then enforces it with one
    /// system call. A ruleset that cannot be fully enforced fails the
    /// sandbox here, unless Landlock is not required.
    pub(crate) fn prepare_landlock(&mut self) -> Result<(), GuestError> {
        let Some((rules, required)) = self.landlock.take() else {
            return Ok(());
        };
        match confine::landlock_prepare_writes(&rules) {
            Ok(prepared) => self.prepared = Some(prepared),
            Err(err) if required => {
                return Err(GuestError::FailedWithHint {
                    op: "build the Landlock ruleset",
                    source: err.into(),
                    hint: "pass --best-effort to run without it".into(),
                })
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// The ruleset's descriptor, which every supervisor keeps for its
    /// command.
    pub(crate) fn landlock_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.prepared.as_ref().map(confine::PreparedLandlock::fd)
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
    pub(crate) fn seal_pid1(&mut self) -> Result<(), GuestError> {
        self.compile_seccomp()?;
        if let Some(program) = self.seccomp.take() {
            self.wants_seccomp = false;
            hako_seccomp::apply(&program).map_err(failed("install the seccomp filter on pid 1"))?;
        }
        Ok(())
    }

    /// Confines the calling supervisor once, before it is given any
    /// command; every command it starts inherits all of it. First it is
    /// made not dumpable, while it still holds pid 1's capabilities (no
    /// command, holding none, could read it before that either), so that
    /// at no moment can a command read or write its memory or descriptors
    /// through `/proc`; then the prepared Landlock ruleset (`landlock`, its
    /// descriptor as the supervisor holds it, see
    /// [`Confinement::landlock_fd`]), `no_new_privs`, and no capabilities
    /// (bounding, ambient, effective, permitted, inheritable; securebits
    /// locked so that root gains none at exec). The supervisor needs none of
    /// them: the processes it watches and kills are of its own uid. The
    /// seccomp filter is inherited from pid 1 ([`Confinement::seal_pid1`]);
    /// a `landlock` sandbox's supervisor installs its second filter last.
    pub(crate) fn confine_supervisor(
        &self,
        landlock: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<(), GuestError> {
        hako_sys::ns::set_not_dumpable().map_err(failed("become not dumpable"))?;
        if let Some(fd) = landlock {
            confine::landlock_restrict_self_with(fd)
                .map_err(failed("enforce the Landlock ruleset"))?;
        }
        confine::set_no_new_privs().map_err(failed("set no_new_privs"))?;
        confine::drop_all_capabilities()
            .map(drop)
            .map_err(failed("drop capabilities"))?;
        if let Some(program) = &self.shared {
            hako_seccomp::apply(program)
                .map_err(failed("install the shared namespaces' seccomp filter"))?;
        }
        Ok(())
    }

    /// What each command's process applies just before exec: its rlimits
    /// (not the supervisor's, which needs descriptors and memory of its
    /// own). The rest comes from the supervisor
    /// ([`Confinement::confine_supervisor`]).
    pub(crate) fn rlimits(&self) -> Arc<Vec<Rlimit>> {
        Arc::clone(&self.rlimits)
    }
}
