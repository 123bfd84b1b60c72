//! Every sandbox flag as a front end was given it, and turning those (with
//! a profile, if one is named) into the one [`SandboxSpec`]: the only place
//! a flag or a profile key is parsed.

use std::path::PathBuf;

use hako_core::env::EnvPolicy;
use hako_core::{Isolation, Limits, NetMode, NetworkPolicy};

use crate::cow::CowRequest;
use crate::limits;
use crate::profile::{Profile, Scalar};
use crate::{BackendArg, SandboxSpec};

/// The sandbox flags as given (on a command line, or by a library user),
/// before a profile is merged in and defaults are filled.
///
/// Each field is one flag of `hako run`, `shell`, `fs`, `mcp` and `serve`
/// (and one key of a profile, `-` written `_`); `None` or empty is "not
/// given". [`SandboxFlags::spec`] merges them with the profile: a flag
/// given wins over the key, and list flags add to the profile's lists.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxFlags {
    /// `--profile FILE`: a TOML profile to read the other settings from.
    pub profile: Option<PathBuf>,
    /// `--backend`.
    pub backend: Option<BackendArg>,
    /// `--workspace` (default: the current directory).
    pub workspace: Option<PathBuf>,
    /// `--env K=V` (repeatable).
    pub env: Vec<(String, String)>,
    /// `--pass-env NAME` (repeatable).
    pub pass_env: Vec<String>,
    /// `--max-output SIZE`.
    pub max_output: Option<usize>,
    /// `--memory SIZE`.
    pub memory: Option<u64>,
    /// `--pids N`.
    pub pids: Option<u64>,
    /// `--cpus N`, in thousandths of a CPU.
    pub cpus: Option<u64>,
    /// `--max-file-size SIZE`.
    pub max_file_size: Option<u64>,
    /// `--max-open-files N`.
    pub max_open_files: Option<u64>,
    /// `--ro DIR` (repeatable).
    pub ro: Vec<PathBuf>,
    /// `--rw DIR` (repeatable).
    pub rw: Vec<PathBuf>,
    /// `--best-effort`.
    pub best_effort: bool,
    /// `--image`.
    pub image: Option<String>,
    /// `--runtime`.
    pub runtime: Option<String>,
    /// `--no-guest`.
    pub no_guest: bool,
    /// `--net MODE`.
    pub net: Option<NetMode>,
    /// `--allow HOST[:PORT]` (repeatable).
    pub allow: Vec<String>,
    /// `--resolve NAME=ADDR` (repeatable).
    pub resolve: Vec<(String, std::net::IpAddr)>,
    /// `--min-isolation LEVEL`: refuse a sandbox weaker than this.
    pub min_isolation: Option<Isolation>,
    /// `--allow-emulated-vm`: an emulated VM (TCG) counts as isolation `vm`.
    pub allow_emulated_vm: bool,
    /// `--max-sessions N`: shell sessions open at once in one sandbox.
    pub max_sessions: Option<usize>,
    /// `--max-processes N`: long-lived processes running at once in one
    /// sandbox.
    pub max_processes: Option<usize>,
    /// `--cow`: a copy-on-write workspace (every change in a private
    /// layer, the workspace never written).
    pub cow: bool,
    /// `--name NAME`: keep the `--cow` layers as the named sandbox NAME.
    pub name: Option<String>,
    /// `--state DIR`: where named sandboxes are kept.
    pub state: Option<PathBuf>,
}

/// What the flags and the profile describe: the backend, the spec, and
/// the copy-on-write layers asked for (made when a sandbox is opened, by
/// [`crate::Opener`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The backend asked for (`auto` stays `auto`; see [`Plan::backend`]).
    pub backend: BackendArg,
    /// The sandbox, without its layers (`spec.cow` is set when they are
    /// made).
    pub spec: SandboxSpec,
    /// `--cow` (with its name and state directory), if asked for.
    pub cow: Option<CowRequest>,
    /// The profile's `timeout`: the deadline of `hako run`'s command when
    /// `--timeout` is not given.
    pub timeout: Option<std::time::Duration>,
    /// The profile's `audit`: the audit log of `hako run`, `mcp` and
    /// `serve` when `--audit` is not given.
    pub audit: Option<PathBuf>,
}

impl Plan {
    /// The backend to resolve: `auto` picks as it does without `--cow`
    /// (every isolating backend gives a copy-on-write workspace; `host`,
    /// which `auto` picks only when nothing else works, refuses it by
    /// name).
    pub fn backend(&self) -> BackendArg {
        self.backend
    }
}

impl SandboxFlags {
    /// The directories the flags alone make writable to a sandbox (the
    /// workspace, or the current directory, and `--rw`): what an audit log
    /// is kept out of when the whole spec could not be read.
    pub fn writable_without_profile(&self) -> Vec<PathBuf> {
        self.workspace
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .into_iter()
            .chain(self.rw.iter().cloned())
            .collect()
    }

    /// The backend and the backend-neutral settings these flags (and the
    /// profile, if one is named) describe; an error names the profile key
    /// or the file at fault. A copy-on-write workspace (`--cow`, or the
    /// profile's `cow = true`) is refused here: its layers must be made
    /// and held by the runtime ([`SandboxFlags::plan`], [`crate::Opener`]),
    /// never dropped for a plain read-write workspace.
    pub fn spec(&self) -> Result<(BackendArg, SandboxSpec), String> {
        let plan = self.plan()?;
        if plan.cow.is_some() {
            return Err("--cow (or the profile's `cow = true`) needs its layers made and held by the runtime; open this sandbox through an Opener".into());
        }
        Ok((plan.backend, plan.spec))
    }

    /// [`SandboxFlags::spec`] with the copy-on-write layers asked for; an
    /// error names the flag, the profile key or the file at fault.
    pub fn plan(&self) -> Result<Plan, String> {
        let p = match &self.profile {
            Some(path) => Profile::load(path)?,
            None => Profile::default(),
        };
        let key = |name: &str, e: String| format!("profile key `{name}`: {e}");
        let backend = match (self.backend, &p.backend) {
            (Some(b), _) => b,
            (None, Some(name)) => name
                .parse::<BackendArg>()
                .map_err(|e| key("backend", e.to_string()))?,
            (None, None) => BackendArg::Auto,
        };
        let workspace = match self.workspace.clone().or(p.workspace) {
            Some(dir) => dir,
            None => std::env::current_dir()
                .map_err(|e| format!("cannot read the current directory: {e}"))?,
        };
        let mut set = Vec::new();
        for (k, v) in p.env {
            if !hako_core::env::valid_name(&k) {
                return Err(key("env", format!("invalid variable name {k:?}")));
            }
            set.push((k, v));
        }
        set.extend(self.env.iter().cloned());
        // Every limit is checked whichever way it came: a flag's parser
        // checked it already, a library user's value or a profile key's
        // is checked here, naming the flag or the key.
        let flag = |name: &str, e: String| format!("--{name} {e}");
        let pick = |name: &str,
                    given: Option<u64>,
                    keyed: Option<Scalar>,
                    parse: fn(&str) -> Result<u64, String>,
                    check: fn(u64) -> Result<u64, String>|
         -> Result<Option<u64>, String> {
            match (given, keyed) {
                (Some(n), _) => check(n)
                    .map(Some)
                    .map_err(|e| flag(&name.replace('_', "-"), e)),
                (None, Some(v)) => parse(&v.text()).map(Some).map_err(|e| key(name, e)),
                (None, None) => Ok(None),
            }
        };
        let max_output = match (self.max_output, p.max_output) {
            (Some(n), _) => {
                limits::check_max_output(n as u64).map_err(|e| flag("max-output", e))?
            }
            (None, Some(v)) => {
                limits::parse_max_output(&v.text()).map_err(|e| key("max_output", e))?
            }
            (None, None) => hako_core::DEFAULT_MAX_OUTPUT,
        };
        let memory = pick(
            "memory",
            self.memory,
            p.memory,
            limits::parse_memory,
            limits::check_memory,
        )?;
        let pids = pick(
            "pids",
            self.pids,
            p.pids,
            limits::parse_pids,
            limits::check_pids,
        )?;
        let cpus = match (self.cpus, p.cpus) {
            (Some(c), _) => Some(limits::check_cpus_milli(c).map_err(|e| flag("cpus", e))?),
            (None, Some(c)) => Some(limits::parse_cpus(&c.text()).map_err(|e| key("cpus", e))?),
            (None, None) => None,
        };
        let file_size = pick(
            "max_file_size",
            self.max_file_size,
            p.max_file_size,
            limits::parse_file_size,
            limits::check_file_size,
        )?;
        let open_files = pick(
            "max_open_files",
            self.max_open_files,
            p.max_open_files,
            limits::parse_open_files,
            limits::check_open_files,
        )?;
        let handles =
            |name: &str, given: Option<usize>, keyed: Option<Scalar>, default: usize| match (
                given, keyed,
            ) {
                (Some(n), _) => {
                    limits::check_handles(n as u64).map_err(|e| flag(&name.replace('_', "-"), e))
                }
                (None, Some(v)) => limits::parse_handles(&v.text()).map_err(|e| key(name, e)),
                (None, None) => Ok(default),
            };
        let max_sessions = handles(
            "max_sessions",
            self.max_sessions,
            p.max_sessions,
            crate::DEFAULT_MAX_SESSIONS,
        )?;
        let max_processes = handles(
            "max_processes",
            self.max_processes,
            p.max_processes,
            crate::DEFAULT_MAX_PROCESSES,
        )?;
        let timeout = match p.timeout {
            Some(v) => Some(limits::parse_timeout(&v.text()).map_err(|e| key("timeout", e))?),
            None => None,
        };
        let audit = p.audit;
        let min_isolation = match (self.min_isolation, p.min_isolation) {
            (Some(level), _) => level,
            (None, Some(name)) => name
                .parse::<Isolation>()
                .map_err(|e| key("min_isolation", e.to_string()))?,
            (None, None) => Isolation::None,
        };
        let mut resolve = Vec::new();
        for (name, addr) in p.resolve {
            resolve.push(parse_resolve(&format!("{name}={addr}")).map_err(|e| key("resolve", e))?);
        }
        resolve.extend(self.resolve.iter().cloned());
        let mut allow = p.allow;
        allow.extend(self.allow.iter().cloned());
        let net = match (self.net, p.net) {
            (Some(mode), _) => Some(mode),
            (None, Some(mode)) => Some(mode.parse::<NetMode>().map_err(|e| key("net", e))?),
            (None, None) => None,
        };
        let network = match net {
            Some(mode) => Some(NetworkPolicy {
                mode,
                allow,
                resolve,
            }),
            None if !allow.is_empty() || !resolve.is_empty() => Some(NetworkPolicy {
                mode: NetMode::Allow,
                allow,
                resolve,
            }),
            None => None,
        };
        let mut pass = p.pass_env;
        pass.extend(self.pass_env.iter().cloned());
        let mut ro = p.ro;
        ro.extend(self.ro.iter().cloned());
        let mut rw = p.rw;
        rw.extend(self.rw.iter().cloned());
        let spec = SandboxSpec {
            workspace,
            env: EnvPolicy { pass, set },
            limits: Limits {
                memory,
                pids,
                cpus_milli: cpus,
                file_size,
                open_files,
            },
            ro,
            rw,
            best_effort: self.best_effort || p.best_effort.unwrap_or(false),
            max_output,
            image: self.image.clone().or(p.image),
            runtime: self.runtime.clone().or(p.runtime),
            no_guest: self.no_guest || p.no_guest.unwrap_or(false),
            network,
            min_isolation,
            allow_emulated_vm: self.allow_emulated_vm,
            max_sessions,
            max_processes,
            cow: None,
        };
        let cow_on = self.cow || p.cow.unwrap_or(false);
        let name = self.name.clone().or(p.name);
        let state = self.state.clone().or(p.state);
        let cow = if cow_on {
            let request = CowRequest { name, state };
            if let Err(e) = request.check() {
                return Err(match self.name {
                    Some(_) => format!("--name: {e}"),
                    None => key("name", e),
                });
            }
            let binds: Vec<PathBuf> = spec.rw.iter().chain(&spec.ro).cloned().collect();
            hako_layers::state::check_binds_apart(&spec.workspace, &binds)
                .map_err(|e| e.to_string())?;
            Some(request)
        } else {
            if name.is_some() {
                return Err("--name (or the profile key `name`) keeps a copy-on-write sandbox's layers: give --cow (or `cow = true`) too".into());
            }
            if state.is_some() {
                return Err("--state (or the profile key `state`) is where copy-on-write sandboxes are kept: give --cow (or `cow = true`) too".into());
            }
            None
        };
        Ok(Plan {
            backend,
            spec,
            cow,
            timeout,
            audit,
        })
    }
}

/// `NAME=ADDR` (`--resolve`): the name lowercased, the address bare or in
/// brackets.
pub fn parse_resolve(s: &str) -> Result<(String, std::net::IpAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=ADDR, got {s:?}"))?;
    let addr = addr
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| format!("{addr:?} is not an IP address"))?;
    if name.is_empty() {
        return Err(format!("expected NAME=ADDR, got {s:?}"));
    }
    Ok((name.to_ascii_lowercase(), addr))
}

/// `K=V` (`--env`), with a valid variable name.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got {s:?}"))?;
    if !hako_core::env::valid_name(k) {
        return Err(format!("invalid variable name {k:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// A size (`512K`, `10M`) that fits in memory (`--max-output`: at most
/// 1G).
pub fn parse_size(s: &str) -> Result<usize, String> {
    limits::parse_max_output(s)
}

/// A size (`256M`, `1G`) in bytes, with a binary suffix.
pub fn parse_size_u64(s: &str) -> Result<u64, String> {
    limits::parse_size_strict(s)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::limits::parse_cpus;

    fn with_profile(text: &str, flags: SandboxFlags) -> Result<(BackendArg, SandboxSpec), String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, text).unwrap();
        SandboxFlags {
            profile: Some(path),
            ..flags
        }
        .spec()
    }

    #[test]
    fn flags_win_over_the_profile_and_lists_add_to_it() {
        let flags = SandboxFlags {
            workspace: Some("/ws".into()),
            backend: Some(BackendArg::Host),
            memory: Some(64 << 20),
            env: vec![("B".into(), "2".into())],
            allow: vec!["example.org".into()],
            ..SandboxFlags::default()
        };
        let (backend, spec) = with_profile(
            "backend = \"linux\"\nmemory = \"1G\"\npids = 64\ncpus = 0.5\nenv = { A = \"1\" }\nallow = [\"pypi.org\"]\n",
            flags,
        )
        .unwrap();
        assert_eq!(backend, BackendArg::Host);
        assert_eq!(spec.workspace, PathBuf::from("/ws"));
        assert_eq!(spec.limits.memory, Some(64 << 20));
        assert_eq!(spec.limits.pids, Some(64));
        assert_eq!(spec.limits.cpus_milli, Some(500));
        assert_eq!(
            spec.env.set,
            [("A".into(), "1".into()), ("B".into(), "2".into())]
        );
        let network = spec.network.unwrap();
        assert_eq!(network.mode, NetMode::Allow);
        assert_eq!(network.allow, ["pypi.org", "example.org"]);
    }

    #[test]
    fn a_bad_profile_value_names_its_key() {
        let flags = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        for (text, named) in [
            (
                "backend = \"bogus\"\n",
                "profile key `backend`: unknown backend",
            ),
            ("memory = \"lots\"\n", "profile key `memory`"),
            ("cpus = 0\n", "profile key `cpus`"),
            ("net = \"sometimes\"\n", "profile key `net`"),
            ("env = { \"A=B\" = \"1\" }\n", "profile key `env`"),
        ] {
            let err = with_profile(text, flags()).unwrap_err();
            assert!(err.starts_with(named), "{text}: {err}");
        }
    }

    #[test]
    fn an_unknown_profile_value_lists_the_valid_ones() {
        let flags = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        for (text, named, valid) in [
            (
                "backend = \"dockr\"\n",
                "profile key `backend`",
                "auto, host, linux, landlock, docker, gvisor, vm",
            ),
            (
                "net = \"open\"\n",
                "profile key `net`",
                "none, allow or host",
            ),
            (
                "min_isolation = \"strong\"\n",
                "profile key `min_isolation`",
                "none, process, kernel, vm",
            ),
            ("timeout = \"soon\"\n", "profile key `timeout`", "30s"),
            (
                "timeout = \"0s\"\n",
                "profile key `timeout`",
                "from 1ms to 24h",
            ),
        ] {
            let err = with_profile(text, flags()).unwrap_err();
            assert!(
                err.starts_with(named) && err.contains(valid),
                "{text}: {err}"
            );
        }
    }

    #[test]
    fn profile_timeout_and_audit_reach_the_plan() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(
            &path,
            "min_isolation = \"process\"\ntimeout = \"90s\"\naudit = \"a.log\"\n",
        )
        .unwrap();
        let plan = SandboxFlags {
            profile: Some(path),
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        }
        .plan()
        .unwrap();
        assert_eq!(plan.spec.min_isolation, Isolation::Process);
        assert_eq!(plan.timeout, Some(std::time::Duration::from_secs(90)));
        assert_eq!(plan.audit, Some(dir.path().join("a.log")));
        // A bare number is seconds; without the keys, nothing is set.
        std::fs::write(dir.path().join("q.toml"), "timeout = 5\n").unwrap();
        let plan = SandboxFlags {
            profile: Some(dir.path().join("q.toml")),
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        }
        .plan()
        .unwrap();
        assert_eq!(plan.timeout, Some(std::time::Duration::from_secs(5)));
        assert_eq!(plan.audit, None);
    }

    #[test]
    fn no_flags_and_no_profile_is_the_default_spec_in_the_current_directory() {
        let (backend, spec) = SandboxFlags::default().spec().unwrap();
        assert_eq!(backend, BackendArg::Auto);
        assert_eq!(spec, SandboxSpec::new(std::env::current_dir().unwrap()));
    }

    #[test]
    fn values_parse_as_their_flags_do() {
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert!(parse_cpus("0").is_err() && parse_cpus("lots").is_err());
        assert_eq!(
            parse_resolve("Pkg.Test=[::1]"),
            Ok(("pkg.test".into(), "::1".parse().unwrap()))
        );
        assert!(parse_resolve("=1.2.3.4").is_err());
        assert_eq!(parse_key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert!(parse_key_value("=b").is_err());
        assert_eq!(parse_size("1K"), Ok(1024));
    }

    #[test]
    fn a_memory_limit_of_one_byte_is_refused_naming_the_flag() {
        let err = SandboxFlags {
            workspace: Some("/ws".into()),
            memory: Some(1),
            ..SandboxFlags::default()
        }
        .spec()
        .unwrap_err();
        assert!(err.starts_with("--memory 1: at least 16M"), "{err}");
        assert!(err.contains("accepted: a number of bytes"), "{err}");
    }

    #[test]
    fn a_pids_limit_of_zero_is_refused_naming_the_flag() {
        let err = SandboxFlags {
            workspace: Some("/ws".into()),
            pids: Some(0),
            ..SandboxFlags::default()
        }
        .spec()
        .unwrap_err();
        assert!(err.starts_with("--pids 0: at least 16"), "{err}");
    }

    #[test]
    fn every_limit_out_of_range_is_refused_naming_its_flag() {
        let base = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        for (flags, named) in [
            (
                SandboxFlags {
                    cpus: Some(0),
                    ..base()
                },
                "--cpus",
            ),
            (
                SandboxFlags {
                    max_open_files: Some(2),
                    ..base()
                },
                "--max-open-files",
            ),
            (
                SandboxFlags {
                    max_file_size: Some(0),
                    ..base()
                },
                "--max-file-size",
            ),
            (
                SandboxFlags {
                    max_output: Some(2 << 30),
                    ..base()
                },
                "--max-output",
            ),
            (
                SandboxFlags {
                    max_sessions: Some(0),
                    ..base()
                },
                "--max-sessions",
            ),
            (
                SandboxFlags {
                    max_processes: Some(0),
                    ..base()
                },
                "--max-processes",
            ),
        ] {
            let err = flags.spec().unwrap_err();
            assert!(err.starts_with(named), "{named}: {err}");
        }
    }

    #[test]
    fn a_bad_limit_in_a_profile_is_refused_naming_its_key() {
        let flags = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        for (text, named) in [
            (
                "memory = \"64MB\"\n",
                "profile key `memory`: \"64MB\" is ambiguous",
            ),
            ("memory = 1\n", "profile key `memory`: 1: at least 16M"),
            ("pids = 0\n", "profile key `pids`: 0: at least 16"),
            ("pids = -1\n", "profile key `pids`"),
            ("max_open_files = 1\n", "profile key `max_open_files`"),
            ("max_file_size = 0\n", "profile key `max_file_size`"),
            ("max_output = \"2G\"\n", "profile key `max_output`"),
            ("max_sessions = 0\n", "profile key `max_sessions`"),
            ("max_processes = \"lots\"\n", "profile key `max_processes`"),
            (
                "min_isolation = \"strong\"\n",
                "profile key `min_isolation`",
            ),
        ] {
            let err = with_profile(text, flags()).unwrap_err();
            assert!(err.starts_with(named), "{text}: {err}");
        }
    }

    #[test]
    fn the_isolation_and_handle_bounds_come_from_the_profile_or_the_defaults() {
        let flags = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        let (_, spec) = flags().spec().unwrap();
        assert_eq!(spec.min_isolation, Isolation::None);
        assert_eq!(spec.max_sessions, crate::DEFAULT_MAX_SESSIONS);
        assert_eq!(spec.max_processes, crate::DEFAULT_MAX_PROCESSES);
        let (_, spec) = with_profile(
            "min_isolation = \"kernel\"\nmax_sessions = 2\nmax_processes = 3\n",
            flags(),
        )
        .unwrap();
        assert_eq!(spec.min_isolation, Isolation::Kernel);
        assert_eq!((spec.max_sessions, spec.max_processes), (2, 3));
        let (_, spec) = with_profile(
            "min_isolation = \"kernel\"\n",
            SandboxFlags {
                min_isolation: Some(Isolation::Process),
                ..flags()
            },
        )
        .unwrap();
        assert_eq!(spec.min_isolation, Isolation::Process, "the flag wins");
    }

    #[test]
    fn a_profile_with_cow_true_asks_for_a_copy_on_write_workspace_that_spec_never_drops() {
        let flags = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, "cow = true\nname = \"fix-1\"\nstate = \"st\"\n").unwrap();
        let plan = SandboxFlags {
            profile: Some(path.clone()),
            ..flags()
        }
        .plan()
        .unwrap();
        let cow = plan.cow.clone().unwrap();
        assert_eq!(cow.name.as_deref(), Some("fix-1"));
        assert_eq!(
            cow.state,
            Some(dir.path().join("st")),
            "relative to the profile"
        );
        assert_eq!(
            plan.backend(),
            BackendArg::Auto,
            "auto with --cow picks as it does without"
        );
        assert!(plan.spec.cow.is_none(), "the layers are made when opened");
        // The plain spec refuses it rather than give a read-write workspace.
        let err = SandboxFlags {
            profile: Some(path),
            ..flags()
        }
        .spec()
        .unwrap_err();
        assert!(err.contains("--cow"), "{err}");
        // A flag wins over the key.
        let plan = SandboxFlags {
            cow: true,
            name: Some("b".into()),
            ..flags()
        }
        .plan()
        .unwrap();
        assert_eq!(plan.cow.unwrap().name.as_deref(), Some("b"));
    }

    #[test]
    fn a_bind_holding_or_inside_a_cow_workspace_is_refused_so_nothing_bypasses_the_layer() {
        // A writable bind of the workspace's parent would show the real
        // workspace at its path, over the layered view.
        for (rw, ro) in [
            (vec![PathBuf::from("/")], vec![]),
            (vec![PathBuf::from("/ws/cache")], vec![]),
            (vec![], vec![PathBuf::from("/ws")]),
        ] {
            let err = SandboxFlags {
                workspace: Some("/ws".into()),
                cow: true,
                rw: rw.clone(),
                ro: ro.clone(),
                ..SandboxFlags::default()
            }
            .plan()
            .unwrap_err();
            assert!(
                err.contains("with --cow") && err.contains("bind a directory apart"),
                "{rw:?} {ro:?}: {err}"
            );
        }
        // Beside it is fine, and without --cow nothing changes.
        for cow in [true, false] {
            SandboxFlags {
                workspace: Some("/ws".into()),
                cow,
                rw: vec!["/wsx".into(), "/other".into()],
                ..SandboxFlags::default()
            }
            .plan()
            .unwrap();
        }
        SandboxFlags {
            workspace: Some("/ws".into()),
            rw: vec!["/".into()],
            ..SandboxFlags::default()
        }
        .plan()
        .unwrap();
    }

    #[test]
    fn a_bad_cow_name_or_a_name_without_cow_is_refused_naming_the_flag_or_key() {
        let flags = || SandboxFlags {
            workspace: Some("/ws".into()),
            ..SandboxFlags::default()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, "cow = true\nname = \"../x\"\n").unwrap();
        let err = SandboxFlags {
            profile: Some(path),
            ..flags()
        }
        .plan()
        .unwrap_err();
        assert!(
            err.starts_with("profile key `name`: invalid sandbox name"),
            "{err}"
        );
        let err = SandboxFlags {
            cow: true,
            name: Some("a/b".into()),
            ..flags()
        }
        .plan()
        .unwrap_err();
        assert!(err.starts_with("--name: invalid sandbox name"), "{err}");
        let err = SandboxFlags {
            name: Some("a".into()),
            ..flags()
        }
        .plan()
        .unwrap_err();
        assert!(err.contains("give --cow"), "{err}");
        let err = SandboxFlags {
            state: Some("/st".into()),
            ..flags()
        }
        .plan()
        .unwrap_err();
        assert!(err.contains("give --cow"), "{err}");
        let err = with_profile("cow = \"yes\"\n", flags()).unwrap_err();
        assert!(err.contains("boolean"), "{err}");
    }
}
