//! The decision log: every connection's verdict becomes a [`NetEvent`],
//! traced and kept in a bounded queue (the oldest dropped and counted)
//! until [`Proxy::take_events`](super::Proxy::take_events).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use hako_core::{NetDecision, NetEvent, NetProtocol};

use super::accept::Ctx;
use super::lock;
use super::shared::Shared;
use crate::allow::printable;

/// Milliseconds since the Unix epoch (an event's `at_ms`).
pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The events not yet taken, oldest first, and how many were dropped
/// since the last take.
#[derive(Default)]
pub(super) struct Events {
    pub(super) queue: VecDeque<NetEvent>,
    pub(super) dropped: u64,
}

impl Events {
    /// Keeps `ev`, dropping (and counting) the oldest beyond `max`; with
    /// `max` 0, nothing is kept and `ev` is counted as dropped.
    fn push(&mut self, ev: NetEvent, max: usize) {
        if max == 0 {
            self.dropped += 1;
            return;
        }
        while self.queue.len() >= max {
            self.queue.pop_front();
            self.dropped += 1;
        }
        self.queue.push_back(ev);
    }
}

impl Shared {
    /// Traces a decision and keeps it for [`Proxy::take_events`](super::Proxy::take_events).
    pub(super) fn record(&self, ev: NetEvent) {
        tracing::info!(
            decision = ?ev.decision,
            protocol = ?ev.protocol,
            host = %ev.host,
            port = ev.port,
            rule = %ev.rule,
            address = ev.address.as_deref().unwrap_or(""),
            bytes_up = ev.bytes_up,
            bytes_down = ev.bytes_down,
            duration_ms = ev.duration_ms,
            message = ev.message.as_deref().unwrap_or(""),
            "egress proxy decision"
        );
        lock(&self.events).push(ev, self.config.max_events);
    }
}

/// Records a refused connection: nothing was connected to.
pub(super) fn event_refused(
    ctx: &Ctx,
    protocol: NetProtocol,
    host: &str,
    port: u16,
    rule: &str,
    message: String,
) {
    ctx.shared.record(NetEvent {
        at_ms: ctx.at_ms,
        decision: NetDecision::Refused,
        protocol,
        host: printable(host),
        port,
        rule: rule.to_string(),
        address: None,
        bytes_up: 0,
        bytes_down: 0,
        duration_ms: duration_ms(ctx.start),
        message: Some(message),
    });
}

/// How an allowed connection ended: the address it reached, the bytes
/// each way, and why it failed (if it did).
pub(super) struct Done {
    pub(super) address: Option<SocketAddr>,
    pub(super) up: u64,
    pub(super) down: u64,
    pub(super) message: Option<String>,
}

/// Records an allowed connection as it ended; why it was ended from
/// outside (idle, reclaimed) unless it failed for a reason of its own.
pub(super) fn event_allowed(
    ctx: &Ctx,
    protocol: NetProtocol,
    host: &str,
    port: u16,
    rule: &str,
    done: Done,
) {
    let message = done.message.or_else(|| ctx.shared.cut_message(ctx.id));
    ctx.shared.record(NetEvent {
        at_ms: ctx.at_ms,
        decision: NetDecision::Allowed,
        protocol,
        host: printable(host),
        port,
        rule: rule.to_string(),
        address: done.address.map(|a| a.to_string()),
        bytes_up: done.up,
        bytes_down: done.down,
        duration_ms: duration_ms(ctx.start),
        message,
    });
}

/// An allowed destination: how the client asked for it, and the rule that
/// let it through.
pub(super) struct Dest<'a> {
    pub(super) proto: NetProtocol,
    pub(super) host: &'a str,
    pub(super) port: u16,
    pub(super) rule: &'a str,
}

impl Dest<'_> {
    /// Records the allowed connection as it ended.
    pub(super) fn record(
        &self,
        ctx: &Ctx,
        address: Option<SocketAddr>,
        (up, down): (u64, u64),
        message: Option<String>,
    ) {
        let done = Done {
            address,
            up,
            down,
            message,
        };
        event_allowed(ctx, self.proto, self.host, self.port, self.rule, done);
    }
}

/// Milliseconds since `start`.
fn duration_ms(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(port: u16) -> NetEvent {
        NetEvent {
            at_ms: 0,
            decision: NetDecision::Refused,
            protocol: NetProtocol::Unknown,
            host: String::new(),
            port,
            rule: "r".into(),
            address: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            message: None,
        }
    }

    #[test]
    fn a_full_queue_drops_its_oldest_events_and_counts_them() {
        let mut events = Events::default();
        for port in 1..=5 {
            events.push(event(port), 3);
        }
        let ports: Vec<u16> = events.queue.iter().map(|e| e.port).collect();
        assert_eq!(ports, [3, 4, 5]);
        assert_eq!(events.dropped, 2);
    }

    #[test]
    fn a_queue_of_size_zero_keeps_nothing_and_counts_everything() {
        let mut events = Events::default();
        events.push(event(1), 0);
        events.push(event(2), 0);
        assert!(events.queue.is_empty());
        assert_eq!(events.dropped, 2);
    }
}
