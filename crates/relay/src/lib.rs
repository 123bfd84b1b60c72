//! What both ends of hako's egress path share. Inside a sandbox in network
//! mode `allow`, the guest's forwarder accepts connections on loopback and
//! hands each to the egress proxy outside ([`handover`]), or, where a
//! descriptor cannot cross, relays its bytes ([`relay()`]); the proxy (the
//! `hako-net` crate) relays its side with the same code. Kept apart from
//! the proxy so that the guest links this and nothing of the proxy.

pub mod handover;
pub mod mux;
pub mod relay;

pub use handover::{announce_forward, hand_over};
pub use relay::{relay, relay_watched, RelaySocket};
