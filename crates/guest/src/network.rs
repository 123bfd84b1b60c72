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
        let allow = Allowlist::parse(&policy.allow).map_err(|e| Error::BadNetworkPolicy {
            message: e.to_string(),
        })?;
        let forwarded = allow.forwarded_ports();
        let mut proxy_port = PROXY_PORT;
        while forwarded.contains(&proxy_port) {
            proxy_port += 1;
        }
        let resolver = if policy.resolve.is_empty() {
            Resolver::system()
        } else {
            Resolver::with_overrides(policy.resolve.clone())
        };
        let proxy =
            Proxy::start(ProxyConfig::new(allow, resolver)).map_err(|source| Error::Io {
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
