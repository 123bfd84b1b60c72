//! A sandbox's network, as every backend sets it up: nothing for `none`
//! and `host` (the backend's namespace or runtime flag does the work);
//! for `allow`, the egress proxy outside the boundary, the listeners the
//! guest opens inside, and the variables that point clients at them.

use std::path::{Path, PathBuf};

use hako_core::{Error, NetMode, NetworkAccess, NetworkPolicy, Result};
use hako_net::{Allowlist, Proxy, ProxyConfig, Resolver};

use crate::proto::{NetListener, NetSpec};

/// Where the proxy's socket directory appears inside every sandbox.
pub const NET_DIR: &str = "/run/hako-net";

/// The proxy's port on loopback inside, unless a forwarded host port
/// takes it (then the next free one above).
pub const PROXY_PORT: u16 = 3128;

/// What a backend builds for a sandbox's network policy.
#[derive(Debug)]
pub struct NetworkSetup {
    /// What the sandbox will be able to reach (for its capabilities).
    pub access: NetworkAccess,
    /// The mode asked for.
    pub mode: NetMode,
    /// The running proxy (`allow`).
    pub proxy: Option<Proxy>,
    /// The guest's listeners (`allow`).
    pub spec: Option<NetSpec>,
    /// Variables every command gets (`allow`: the proxy's address).
    pub env: Vec<(String, String)>,
}

impl NetworkSetup {
    /// Checks the policy and, for `allow`, starts the proxy (a malformed
    /// allowlist fails here, naming the entry).
    pub fn new(policy: &NetworkPolicy) -> Result<NetworkSetup> {
        let access = match policy.mode {
            NetMode::None => NetworkAccess::None,
            NetMode::Host => NetworkAccess::Host,
            NetMode::Allow => NetworkAccess::Allowlist,
        };
        let mut setup = NetworkSetup {
            access,
            mode: policy.mode,
            proxy: None,
            spec: None,
            env: Vec::new(),
        };
        if policy.mode != NetMode::Allow {
            if !policy.allow.is_empty() {
                return Err(Error::BadNetworkPolicy {
                    message: format!(
                        "--allow is given but the network mode is `{}`; use --net allow",
                        policy.mode.name()
                    ),
                });
            }
            return Ok(setup);
        }
        // What a killed hako left behind, once per process.
        static COLLECT: std::sync::Once = std::sync::Once::new();
        COLLECT.call_once(|| {
            hako_net::remove_stale_dirs(None);
        });
        let allow = Allowlist::parse(&policy.allow).map_err(|e| Error::BadNetworkPolicy {
            message: e.to_string(),
        })?;
        let forwarded = allow.forwarded_ports();
        let mut proxy_port = PROXY_PORT;
        while forwarded.contains(&proxy_port) {
            proxy_port = proxy_port.checked_add(1).unwrap_or(1024);
        }
        let resolver = if policy.resolve.is_empty() {
            Resolver::system()
        } else {
            Resolver::with_overrides(policy.resolve.clone())
        };
        // Bound now, served once the guest is up (see `GuestSandbox::new`):
        // a caller that forks the guest from itself must still have one
        // thread then.
        let proxy = Proxy::bind(ProxyConfig::new(allow, resolver)).map_err(|source| Error::Io {
            op: "start the egress proxy",
            source,
        })?;
        let mut listeners = vec![NetListener {
            port: proxy_port,
            forward: None,
        }];
        listeners.extend(forwarded.into_iter().map(|port| NetListener {
            port,
            forward: Some(port),
        }));
        setup.spec = Some(NetSpec {
            socket: Path::new(NET_DIR).join(hako_net::SOCKET_NAME),
            listeners,
        });
        setup.env = hako_net::proxy_env(proxy_port);
        setup.proxy = Some(proxy);
        Ok(setup)
    }

    /// The host directory to bind read-only at [`NET_DIR`] (`allow`).
    pub fn socket_dir(&self) -> Option<PathBuf> {
        self.proxy.as_ref().map(|p| p.socket_dir().to_path_buf())
    }

    /// `base` with the proxy's variables set (they replace any of the same
    /// name: in `allow` mode no other route out exists).
    pub fn apply_env(&self, base: &mut Vec<(String, String)>) {
        for (name, value) in &self.env {
            base.retain(|(n, _)| n != name);
            base.push((name.clone(), value.clone()));
        }
    }

    /// The refusal for a backend that cannot enforce this mode.
    pub fn unavailable(&self, backend: &str, reason: impl Into<String>) -> Error {
        Error::NetworkUnavailable {
            backend: backend.into(),
            mode: self.mode.name(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn none_and_host_start_no_proxy_and_allow_starts_one_with_its_listeners() {
        for policy in [NetworkPolicy::none(), NetworkPolicy::host()] {
            let setup = NetworkSetup::new(&policy).unwrap();
            assert!(setup.proxy.is_none() && setup.spec.is_none() && setup.env.is_empty());
        }
        let setup =
            NetworkSetup::new(&NetworkPolicy::allow(["localhost:11434", "pkg.test"])).unwrap();
        assert_eq!(setup.access, NetworkAccess::Allowlist);
        let spec = setup.spec.as_ref().unwrap();
        assert_eq!(spec.socket, Path::new(NET_DIR).join(hako_net::SOCKET_NAME));
        assert_eq!(
            spec.listeners,
            vec![
                NetListener {
                    port: PROXY_PORT,
                    forward: None
                },
                NetListener {
                    port: 11434,
                    forward: Some(11434)
                },
            ]
        );
        let dir = setup.socket_dir().unwrap();
        assert!(dir.join(hako_net::SOCKET_NAME).exists());
        let mut env = vec![("HTTP_PROXY".to_string(), "http://elsewhere:1".to_string())];
        setup.apply_env(&mut env);
        assert_eq!(
            env.iter()
                .filter(|(n, _)| n == "HTTP_PROXY")
                .collect::<Vec<_>>(),
            [&(
                "HTTP_PROXY".to_string(),
                format!("http://127.0.0.1:{PROXY_PORT}")
            )]
        );
        drop(setup);
        assert!(!dir.exists(), "the proxy's directory outlived it");
    }

    #[test]
    fn the_proxy_port_moves_out_of_the_way_of_a_forwarded_one() {
        let policy = NetworkPolicy::allow([
            format!("localhost:{PROXY_PORT}"),
            format!("localhost:{}", PROXY_PORT + 1),
        ]);
        let setup = NetworkSetup::new(&policy).unwrap();
        let ports: Vec<u16> = setup
            .spec
            .unwrap()
            .listeners
            .iter()
            .map(|l| l.port)
            .collect();
        assert_eq!(ports, [PROXY_PORT + 2, PROXY_PORT, PROXY_PORT + 1]);
    }

    #[test]
    fn allow_entries_without_allow_mode_and_bad_entries_are_refused() {
        let mut policy = NetworkPolicy::none();
        policy.allow = vec!["pkg.test".into()];
        assert!(matches!(
            NetworkSetup::new(&policy),
            Err(Error::BadNetworkPolicy { message }) if message.contains("--net allow")
        ));
        assert!(matches!(
            NetworkSetup::new(&NetworkPolicy::allow(["exa mple.org"])),
            Err(Error::BadNetworkPolicy { message }) if message.contains("exa mple.org")
        ));
    }
}
