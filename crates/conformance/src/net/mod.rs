//! The network kit: what `none`, `allow` and `host` mean, checked the same
//! way on every isolating backend through `exec` of busybox's `nc` and
//! `wget` inside.
//!
//! Nothing here sends a packet anywhere but to loopback or to a network
//! namespace the kit creates itself: a name that must be reached resolves
//! (through the proxy's own resolver, `--resolve`) to a server the kit
//! starts in a namespace of its own behind a veth pair, on a documentation
//! address (198.51.100.0/24), which the proxy treats as public; the kit
//! checks that the route to it leads into that veth before anything
//! connects. Every refusal
//! of another address (private, metadata) happens in the proxy's policy,
//! before any connection is tried. The cases that need that namespace need
//! root; the others run anywhere.
//!
//! ```ignore
//! hako_conformance::network_tests!(linux, |ws: &Path, net: NetworkPolicy| {
//!     let mut config = LinuxConfig::new(ws);
//!     config.spec.network = Some(net);
//!     Ok(Box::new(LinuxSandbox::new(config)?))
//! });
//! ```
//!
//! The cases, by theme: `reach` (what is allowed is reached), `policy`
//! (what the proxy refuses), `ports` (the host's loopback ports), `bypass`
//! (getting around the proxy), `modes` (`none`, `host`, a malformed
//! allowlist); `servers` holds what they reach, `support` what they share.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use hako_core::{Error, NetworkPolicy, Sandbox};

use crate::Outcome;

/// Fails the check with a message unless `$cond` holds. Shadows the main
/// kit's `ensure!`: the error here becomes a `String` or a [`Skip`], not an
/// `Outcome`.
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

mod bypass;
mod forwarder;
mod modes;
mod policy;
mod ports;
mod reach;
mod servers;
mod support;

use bypass::*;
use forwarder::*;
use modes::*;
use policy::*;
use ports::*;
use reach::*;
pub use servers::{HostService, TestNetwork};

/// Builds the sandbox under test on a workspace with a network policy.
pub type NetFactory = dyn Fn(&Path, NetworkPolicy) -> Result<Box<dyn Sandbox>, Error> + Send + Sync;

/// Pins a closure's signature down as a [`NetFactory`].
pub fn net_factory<F>(f: F) -> Arc<NetFactory>
where
    F: Fn(&Path, NetworkPolicy) -> Result<Box<dyn Sandbox>, Error> + Send + Sync + 'static,
{
    Arc::new(f)
}

/// One network case.
#[derive(Debug, Clone, Copy)]
pub struct NetCase {
    /// Its name (and the generated test's).
    pub name: &'static str,
    /// Runs it.
    pub run: fn(&Path, &NetFactory) -> Result<(), Skip>,
}

/// Why a case did not pass.
#[derive(Debug)]
pub enum Skip {
    /// A check failed.
    Failed(String),
    /// The case cannot run here.
    Skipped(String),
    /// The backend refused the case's network mode by name before it
    /// started anything (`Error::NetworkUnavailable`): fail closed, which
    /// the kit accepts for a mode the backend cannot enforce.
    Refused(String),
}

impl From<String> for Skip {
    fn from(s: String) -> Self {
        Skip::Failed(s)
    }
}

impl From<&str> for Skip {
    fn from(s: &str) -> Self {
        Skip::Failed(s.to_string())
    }
}

/// Every network case.
pub const NET_CASES: &[NetCase] = &[
    NetCase {
        name: "allowed_name_is_reached_through_the_http_proxy",
        run: allowed_name_is_reached_through_the_http_proxy,
    },
    NetCase {
        name: "connect_tunnel_to_an_allowed_name_carries_bytes_both_ways",
        run: connect_tunnel_to_an_allowed_name_carries_bytes_both_ways,
    },
    NetCase {
        name: "name_not_on_the_allowlist_is_refused_naming_the_rule",
        run: name_not_on_the_allowlist_is_refused_naming_the_rule,
    },
    NetCase {
        name: "ip_literal_not_on_the_allowlist_is_refused",
        run: ip_literal_not_on_the_allowlist_is_refused,
    },
    NetCase {
        name: "dns_rebinding_a_listed_name_to_a_private_address_is_refused",
        run: dns_rebinding_a_listed_name_to_a_private_address_is_refused,
    },
    NetCase {
        name: "cloud_metadata_addresses_are_refused_by_the_proxy_policy",
        run: cloud_metadata_addresses_are_refused_by_the_proxy_policy,
    },
    NetCase {
        name: "forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed",
        run: forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed,
    },
    NetCase {
        name: "direct_connection_to_a_host_loopback_port_not_allowed_fails",
        run: direct_connection_to_a_host_loopback_port_not_allowed_fails,
    },
    NetCase {
        name: "direct_connection_that_bypasses_the_proxy_has_no_route",
        run: direct_connection_that_bypasses_the_proxy_has_no_route,
    },
    NetCase {
        name: "raw_and_packet_sockets_are_refused_inside",
        run: raw_and_packet_sockets_are_refused_inside,
    },
    NetCase {
        name: "network_none_has_no_proxy_and_reaches_no_host_port",
        run: network_none_has_no_proxy_and_reaches_no_host_port,
    },
    NetCase {
        name: "host_network_is_reported_or_refused_by_name",
        run: host_network_is_reported_or_refused_by_name,
    },
    NetCase {
        name: "malformed_allowlist_entry_is_refused_before_the_sandbox_starts",
        run: malformed_allowlist_entry_is_refused_before_the_sandbox_starts,
    },
    NetCase {
        name: "the_forwarder_killed_refuses_later_connections_at_once_and_the_sandbox_goes_on",
        run: the_forwarder_killed_refuses_later_connections_at_once_and_the_sandbox_goes_on,
    },
];

/// Runs one network case by name on a fresh workspace.
pub fn run_net_case(name: &str, make: &NetFactory) -> Outcome {
    let Some(case) = NET_CASES.iter().find(|c| c.name == name) else {
        return Outcome::Failed(format!("no network case named {name:?}"));
    };
    let ws = match tempfile::tempdir() {
        Ok(ws) => ws,
        Err(e) => return Outcome::Failed(format!("cannot make a workspace: {e}")),
    };
    let ws_path: PathBuf = match ws.path().canonicalize() {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(e.to_string()),
    };
    match (case.run)(&ws_path, make) {
        Ok(()) => Outcome::Passed,
        Err(Skip::Failed(m)) => Outcome::Failed(m),
        Err(Skip::Skipped(m)) => Outcome::Skipped(m),
        Err(Skip::Refused(m)) => {
            eprintln!("REFUSED {name}: {m}");
            Outcome::Passed
        }
    }
}

/// Runs one network case as a test (see [`crate::run_test`]).
pub fn run_net_test(name: &str, make: &NetFactory) {
    match run_net_case(name, make) {
        Outcome::Passed => {}
        Outcome::Failed(message) => panic!("{name} failed: {message}"),
        Outcome::Skipped(reason) if crate::must_work() => {
            panic!("{name} was skipped but HAKO_MUST_WORK=1: {reason}")
        }
        Outcome::Skipped(reason) => eprintln!("SKIPPED {name}: {reason}"),
    }
}

/// Expands to a module `$name` with one `#[test]` per network case, each
/// building its sandboxes with `$factory` (a closure `|&Path,
/// NetworkPolicy| -> Result<Box<dyn Sandbox>, Error>`).
#[macro_export]
macro_rules! network_tests {
    ($name:ident, $factory:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            fn make() -> std::sync::Arc<$crate::net::NetFactory> {
                $crate::net::net_factory($factory)
            }

            $crate::__hako_net_case!(allowed_name_is_reached_through_the_http_proxy);
            $crate::__hako_net_case!(connect_tunnel_to_an_allowed_name_carries_bytes_both_ways);
            $crate::__hako_net_case!(name_not_on_the_allowlist_is_refused_naming_the_rule);
            $crate::__hako_net_case!(ip_literal_not_on_the_allowlist_is_refused);
            $crate::__hako_net_case!(dns_rebinding_a_listed_name_to_a_private_address_is_refused);
            $crate::__hako_net_case!(cloud_metadata_addresses_are_refused_by_the_proxy_policy);
            $crate::__hako_net_case!(forwarded_host_port_is_reached_at_127_0_0_1_only_when_allowed);
            $crate::__hako_net_case!(direct_connection_to_a_host_loopback_port_not_allowed_fails);
            $crate::__hako_net_case!(direct_connection_that_bypasses_the_proxy_has_no_route);
            $crate::__hako_net_case!(raw_and_packet_sockets_are_refused_inside);
            $crate::__hako_net_case!(network_none_has_no_proxy_and_reaches_no_host_port);
            $crate::__hako_net_case!(host_network_is_reported_or_refused_by_name);
            $crate::__hako_net_case!(
                malformed_allowlist_entry_is_refused_before_the_sandbox_starts
            );
            $crate::__hako_net_case!(
                the_forwarder_killed_refuses_later_connections_at_once_and_the_sandbox_goes_on
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __hako_net_case {
    ($case:ident) => {
        #[test]
        fn $case() {
            $crate::net::run_net_test(stringify!($case), make().as_ref());
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_case_is_in_the_macro() {
        // Without whitespace: rustfmt may break a long invocation.
        let source: String = include_str!("mod.rs").split_whitespace().collect();
        for case in NET_CASES {
            let line = format!("__hako_net_case!({});", case.name);
            assert!(
                source.contains(&line),
                "{} is not in network_tests!",
                case.name
            );
        }
    }

    #[test]
    fn network_case_names_are_unique_sentences() {
        let mut seen = std::collections::BTreeSet::new();
        for case in NET_CASES {
            assert!(seen.insert(case.name), "{} is listed twice", case.name);
            assert!(
                case.name.split('_').count() >= 4,
                "{} is not a sentence",
                case.name
            );
        }
    }

    #[test]
    fn an_unknown_case_fails_and_a_backend_that_cannot_run_here_skips() {
        let unsupported = net_factory(|_ws: &Path, _net: NetworkPolicy| {
            Err(Error::Unsupported {
                backend: "none".into(),
                capability: "network",
            })
        });
        let broken = net_factory(|_ws: &Path, _net: NetworkPolicy| {
            Err(Error::InvalidCommand {
                reason: "no backend".into(),
            })
        });
        assert!(matches!(
            run_net_case("no_such_case", unsupported.as_ref()),
            Outcome::Failed(_)
        ));
        for name in [
            "ip_literal_not_on_the_allowlist_is_refused",
            "malformed_allowlist_entry_is_refused_before_the_sandbox_starts",
        ] {
            assert!(
                matches!(
                    run_net_case(name, unsupported.as_ref()),
                    Outcome::Skipped(_)
                ),
                "{name}"
            );
        }
        match run_net_case(
            "ip_literal_not_on_the_allowlist_is_refused",
            broken.as_ref(),
        ) {
            Outcome::Failed(message) => assert!(message.contains("no backend"), "{message}"),
            other => panic!("{other:?}"),
        }
    }
}
