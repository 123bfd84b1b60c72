//! The connections a proxy is serving: both ends of each, so that shutdown,
//! the idle timeout and a reclaim (see [`crate::budget`]) can end it from
//! outside its thread; whether its bytes still move; and why it was ended,
//! for the record its thread writes as it ends.

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::relay::Sock;

/// When a connection's bytes last moved, in nanoseconds since [`epoch`]:
/// the copies of its bytes set it each time they read or write something.
pub(crate) type Progress = Arc<AtomicU64>;

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// `at` as a [`Progress`] value.
fn stamp(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

/// A fresh [`Progress`]: bytes moved now.
pub(crate) fn progress() -> Progress {
    Arc::new(AtomicU64::new(stamp(Instant::now())))
}

/// Notes that bytes moved now.
pub(crate) fn touch(progress: Option<&AtomicU64>) {
    if let Some(p) = progress {
        p.fetch_max(stamp(Instant::now()), Ordering::Relaxed);
    }
}

/// How long the bytes of `progress` have not moved, as of `now`.
fn quiet_for(progress: &AtomicU64, now: Instant) -> Duration {
    Duration::from_nanos(stamp(now).saturating_sub(progress.load(Ordering::Relaxed)))
}

/// Why a connection was ended from outside its thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cut {
    /// It moved no bytes either way for the idle timeout.
    Idle(Duration),
    /// Its place went to another proxy (the reason, as recorded).
    Reclaimed(String),
}

impl Cut {
    fn message(&self) -> String {
        match self {
            Cut::Idle(idle) => format!(
                "closed after {} with no bytes either way (the idle timeout)",
                show(*idle)
            ),
            Cut::Reclaimed(why) => why.clone(),
        }
    }
}

fn show(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.as_secs() > 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{} ms", d.as_millis())
    }
}

/// A connection the proxy is serving.
pub(crate) struct Live {
    /// The client's end (the proxy's socket, or the sandbox's own
    /// connection once handed over).
    pub(crate) client: Sock,
    upstream: Option<TcpStream>,
    /// Relaying: the decision is made and the upstream connected; from
    /// now on the idle timeout applies (before, the handshake's does).
    relaying: bool,
    progress: Progress,
    cut: Option<Cut>,
    /// Its place in the budget was already given back (by a reclaim).
    released: bool,
}

impl Live {
    fn shut(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        if let Some(up) = &self.upstream {
            let _ = up.shutdown(Shutdown::Both);
        }
    }

    /// Adds the upstream end (if a handle on it could be kept): the
    /// connection relays from now on.
    pub(crate) fn start_relaying(&mut self, upstream: Option<TcpStream>) {
        if upstream.is_some() {
            self.upstream = upstream;
        }
        self.relaying = true;
        touch(Some(&self.progress));
    }
}

/// Every connection a proxy is serving.
#[derive(Default)]
pub(crate) struct Conns {
    /// The proxy is shutting down: nothing is added any more.
    pub(crate) closed: bool,
    next_id: u64,
    live: HashMap<u64, Live>,
}

impl Conns {
    /// Adds a connection; its id.
    pub(crate) fn insert(&mut self, client: Sock, progress: Progress) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.live.insert(
            id,
            Live {
                client,
                upstream: None,
                relaying: false,
                progress,
                cut: None,
                released: false,
            },
        );
        id
    }

    /// Removes a connection that ended; whether its place in the budget is
    /// still to be given back.
    pub(crate) fn remove(&mut self, id: u64) -> bool {
        self.live.remove(&id).is_some_and(|live| !live.released)
    }

    pub(crate) fn get_mut(&mut self, id: Option<u64>) -> Option<&mut Live> {
        id.and_then(|id| self.live.get_mut(&id))
    }

    pub(crate) fn len(&self) -> usize {
        self.live.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Shuts down both ends of every connection.
    pub(crate) fn shut_all(&self) {
        for live in self.live.values() {
            live.shut();
        }
    }

    /// Why connection `id` was ended from outside, if it was.
    pub(crate) fn cut_message(&self, id: Option<u64>) -> Option<String> {
        let live = self.live.get(&id?)?;
        live.cut.as_ref().map(Cut::message)
    }

    /// Ends every relaying connection whose bytes have not moved for
    /// `idle` as of `now`.
    fn cut_idle(&mut self, now: Instant, idle: Duration) {
        for live in self.live.values_mut() {
            if live.relaying && live.cut.is_none() && quiet_for(&live.progress, now) >= idle {
                live.cut = Some(Cut::Idle(idle));
                live.shut();
            }
        }
    }

    /// Ends the connection quiet the longest (the oldest of those quiet as
    /// long) that is not already ended, and marks its place as given back;
    /// whether there was one.
    pub(crate) fn reclaim_one(&mut self, why: &str) -> bool {
        let victim = self
            .live
            .iter_mut()
            .filter(|(_, live)| live.cut.is_none() && !live.released)
            .min_by_key(|(id, live)| (live.progress.load(Ordering::Relaxed), **id));
        let Some((_, live)) = victim else {
            return false;
        };
        live.cut = Some(Cut::Reclaimed(why.to_string()));
        live.released = true;
        live.shut();
        true
    }
}

/// Ends relayed connections that move no bytes either way for `idle`,
/// looking every `idle / 8` (between 10 ms and 5 s), until the proxy
/// closes (`conns.closed`, with `tick` notified).
pub(crate) fn watch_idle(conns: &Mutex<Conns>, tick: &Condvar, idle: Duration) {
    let every = (idle / 8).clamp(Duration::from_millis(10), Duration::from_secs(5));
    let mut guard = conns.lock().unwrap_or_else(|p| p.into_inner());
    while !guard.closed {
        guard.cut_idle(Instant::now(), idle);
        guard = match tick.wait_timeout(guard, every) {
            Ok((guard, _)) => guard,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::net::UnixStream;

    fn conn(conns: &mut Conns) -> (u64, Progress, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let progress = progress();
        let id = conns.insert(Sock::Unix(theirs), Arc::clone(&progress));
        (id, progress, ours)
    }

    #[test]
    fn only_a_relaying_connection_whose_bytes_stand_still_is_cut_for_idleness() {
        let mut conns = Conns::default();
        let (handshake, _, _a) = conn(&mut conns);
        let (quiet, _, _b) = conn(&mut conns);
        let (busy, busy_progress, _c) = conn(&mut conns);
        for id in [quiet, busy] {
            conns.get_mut(Some(id)).unwrap().start_relaying(None);
        }
        let idle = Duration::from_secs(60);
        let start = Instant::now();
        conns.cut_idle(start + idle / 2, idle);
        assert_eq!(conns.cut_message(Some(quiet)), None);
        // Bytes moved half way.
        busy_progress.fetch_max(stamp(start + idle / 2), Ordering::Relaxed);
        conns.cut_idle(start + idle + idle / 4, idle);
        assert_eq!(conns.cut_message(Some(handshake)), None);
        assert_eq!(conns.cut_message(Some(busy)), None);
        assert_eq!(
            conns.cut_message(Some(quiet)).as_deref(),
            Some("closed after 60 s with no bytes either way (the idle timeout)")
        );
        // Cut for idleness, its place is still the proxy's to give back.
        assert!(conns.remove(quiet));
    }

    #[test]
    fn a_reclaim_ends_the_connection_quiet_the_longest_and_gives_its_place_back() {
        let mut conns = Conns::default();
        let (older, older_progress, _a) = conn(&mut conns);
        let (newer, _, _b) = conn(&mut conns);
        // The older one moved bytes since: the newer has been quiet longer.
        older_progress.fetch_max(
            stamp(Instant::now() + Duration::from_secs(1)),
            Ordering::Relaxed,
        );
        assert!(conns.reclaim_one("room"));
        assert_eq!(conns.cut_message(Some(newer)).as_deref(), Some("room"));
        assert_eq!(conns.cut_message(Some(older)), None);
        assert!(!conns.remove(newer));
        assert!(conns.reclaim_one("room"));
        assert!(!conns.reclaim_one("room"));
        assert!(!conns.remove(older));
    }
}
