#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The landlock backend's network: the network kit, unchanged. `none` and
//! `host` hold as on every backend; `allow` is refused by this backend
//! (Landlock filters TCP by port alone), which the kit's cases for it
//! check as a refusal naming the mode.

use std::path::Path;

use hako_core::NetworkPolicy;
use hako_landlock::{LandlockConfig, LandlockSandbox};

hako_conformance::network_tests!(landlock_network, |ws: &Path, net: NetworkPolicy| {
    let mut config = LandlockConfig::new(ws);
    config.spec.network = Some(net);
    Ok(Box::new(LandlockSandbox::new(config)?))
});
