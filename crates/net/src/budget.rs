//! The live connections the proxies of one process share, and each
//! proxy's fair share of them.
//!
//! A proxy is one sandbox's way out; a process (`hako serve`, an MCP
//! server) may run many sandboxes, and every proxied connection costs it
//! descriptors. The process's budget of connections, from its descriptor
//! limit, is divided evenly among the proxies alive in it: each proxy may
//! hold at most its *share*, `budget / proxies` (and never more than its
//! own `max_connections`).
//!
//! Invariants:
//! - The shares of the proxies alive together never add up to more than
//!   the budget, so a proxy below its share is always served, whatever the
//!   others hold: one sandbox cannot starve another.
//! - A proxy can hold more than its share only because the share shrank
//!   after it took its connections (another proxy started, or the
//!   descriptor limit was lowered). When a proxy below its share then finds
//!   the budget spent, the proxy furthest over its share gives up the
//!   connection of its that has been quiet the longest ([`Reclaim`]).
//! - A refusal names the limit that was hit ([`Limit`]): the proxy's own
//!   share, or (only if nothing could be reclaimed) the process's budget.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

/// Rule: the sandbox already holds its share of the process's connections
/// (the lesser of its own `max_connections` and an even share of the
/// process's budget among its sandboxes).
pub const RULE_TOO_MANY_CONNECTIONS: &str = "too-many-connections";
/// Rule: the process's budget of connections was spent and no sandbox held
/// more than its share, so nothing could be reclaimed.
pub const RULE_PROCESS_CONNECTIONS: &str = "process-connection-limit";

/// Descriptors one proxied connection may hold at once: its two sockets
/// and the clones that let shutdown and the relay reach them, with room to
/// spare.
const FDS_PER_CONNECTION: u64 = 12;
/// Descriptors left to everything else the process does (its sandboxes,
/// its files) whatever the proxies take.
const FDS_RESERVED: u64 = 256;

/// The most connections all proxies of this process may hold at once, from
/// its soft descriptor limit, read now: a sandbox that opens connections
/// without end runs into its share, and the process (and its other
/// sandboxes) never into "too many open files".
fn descriptor_budget() -> usize {
    use rustix::process::{getrlimit, Resource};
    budget_for(getrlimit(Resource::Nofile).current)
}

/// [`descriptor_budget`] for a soft descriptor limit (`None`: unlimited).
fn budget_for(soft: Option<u64>) -> usize {
    match soft {
        Some(soft) => usize::try_from(soft.saturating_sub(FDS_RESERVED) / FDS_PER_CONNECTION)
            .unwrap_or(usize::MAX),
        None => usize::MAX,
    }
}

/// The share of one proxy whose own limit is `max`, when `proxies` share
/// `capacity` connections.
fn share_of(capacity: usize, proxies: usize, max: usize) -> usize {
    max.min(capacity / proxies.max(1))
}

/// Which limit refused a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Limit {
    /// The proxy holds `held` connections, its whole share.
    Share {
        held: usize,
        share: usize,
        max: usize,
        capacity: usize,
        proxies: usize,
    },
    /// `live` connections of every proxy sharing the budget had spent its
    /// `capacity` (the process's, from its descriptor limit, if
    /// `descriptors`), and none of those proxies held more than its share.
    Process {
        live: usize,
        capacity: usize,
        descriptors: bool,
    },
}

impl Limit {
    /// The rule a refusal names.
    pub(crate) fn rule(&self) -> &'static str {
        match self {
            Limit::Share { .. } => RULE_TOO_MANY_CONNECTIONS,
            Limit::Process { .. } => RULE_PROCESS_CONNECTIONS,
        }
    }

    /// Why the connection was refused.
    pub(crate) fn message(&self) -> String {
        match *self {
            Limit::Share {
                held,
                share,
                max,
                capacity,
                proxies,
            } => format!(
                "this sandbox holds {held} connections, its whole share of {share} (the lesser of \
                 its own limit, {max}, and an even share of the {capacity} connections its \
                 process allows among its {proxies} sandboxes); other sandboxes are not affected"
            ),
            Limit::Process {
                live,
                capacity,
                descriptors,
            } => format!(
                "the sandboxes of this process hold {live} connections, all {capacity} {} \
                 allows, and none holds more than its share",
                if descriptors {
                    "its descriptor limit"
                } else {
                    "their budget"
                }
            ),
        }
    }
}

/// A proxy that can give up one of its connections so that another proxy
/// gets its share.
pub(crate) trait Reclaim: Send + Sync {
    /// Ends (shuts down) the live connection of this proxy that has been
    /// quiet the longest, recording `why` as the reason, and marks it as
    /// already given back to the budget (its end must not give it back
    /// again). False if there was none to end.
    fn reclaim_one(&self, why: &str) -> bool;
}

enum Capacity {
    /// From the process's descriptor limit, read at each admission.
    Descriptors,
    /// A fixed number of connections.
    Fixed(usize),
}

struct Member {
    live: usize,
    max: usize,
    holder: Weak<dyn Reclaim>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    /// Connections given out and not yet given back, members' and those of
    /// proxies that left with connections still ending.
    live: usize,
    members: BTreeMap<u64, Member>,
}

struct Inner {
    capacity: Capacity,
    state: Mutex<State>,
}

/// The live connections a set of proxies share, divided evenly among those
/// alive (see the module's documentation). Cloning gives another handle on
/// the same budget.
#[derive(Clone)]
pub struct ConnectionBudget {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ConnectionBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("ConnectionBudget")
            .field("capacity", &self.capacity())
            .field("live", &state.live)
            .field("proxies", &state.members.len())
            .finish()
    }
}

impl ConnectionBudget {
    /// The budget every proxy of this process shares (what
    /// [`ProxyConfig::new`](crate::ProxyConfig::new) uses): as many
    /// connections as the process's soft descriptor limit leaves room for,
    /// read at each admission, with [`FDS_RESERVED`] descriptors kept for
    /// everything else.
    pub fn process() -> ConnectionBudget {
        static PROCESS: OnceLock<ConnectionBudget> = OnceLock::new();
        PROCESS
            .get_or_init(|| ConnectionBudget::with(Capacity::Descriptors))
            .clone()
    }

    /// A budget of its own, of `connections` connections, shared only by
    /// the proxies given it.
    pub fn fixed(connections: usize) -> ConnectionBudget {
        ConnectionBudget::with(Capacity::Fixed(connections))
    }

    fn with(capacity: Capacity) -> ConnectionBudget {
        ConnectionBudget {
            inner: Arc::new(Inner {
                capacity,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// How many connections the budget allows now.
    pub fn capacity(&self) -> usize {
        match self.inner.capacity {
            Capacity::Descriptors => descriptor_budget(),
            Capacity::Fixed(n) => n,
        }
    }

    fn follows_descriptors(&self) -> bool {
        matches!(self.inner.capacity, Capacity::Descriptors)
    }

    /// How many connections are held now, by every proxy sharing it.
    pub fn live(&self) -> usize {
        self.lock().live
    }

    /// How many proxies share it now.
    pub fn proxies(&self) -> usize {
        self.lock().members.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes a proxy whose own limit is `max` one of those sharing the
    /// budget, until the [`Seat`] is dropped (or left).
    pub(crate) fn join(&self, max: usize, holder: Weak<dyn Reclaim>) -> Seat {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.members.insert(
            id,
            Member {
                live: 0,
                max,
                holder,
            },
        );
        Seat {
            budget: self.clone(),
            id,
        }
    }
}

/// One proxy's place in a [`ConnectionBudget`].
pub(crate) struct Seat {
    budget: ConnectionBudget,
    id: u64,
}

impl Seat {
    /// Takes a connection from the budget for this proxy: within its share,
    /// reclaiming one from a proxy over its share if the budget is spent;
    /// or the limit that refuses it. A taken connection is given back with
    /// [`Seat::release`] (unless it was reclaimed).
    ///
    /// Called without any lock of a proxy held: reclaiming takes the other
    /// proxy's.
    pub(crate) fn admit(&self) -> Result<(), Limit> {
        let capacity = self.budget.capacity();
        // Proxies reached to reclaim from, dropped only after the lock
        // below: the last handle on a proxy that is going away drops its
        // seat, which takes the lock.
        let mut reached = Vec::new();
        let mut state = self.budget.lock();
        let proxies = state.members.len();
        let Some(me) = state.members.get(&self.id) else {
            // Left already (the proxy is shutting down).
            return Err(Limit::Process {
                live: state.live,
                capacity,
                descriptors: self.budget.follows_descriptors(),
            });
        };
        let share = share_of(capacity, proxies, me.max);
        if me.live >= share {
            return Err(Limit::Share {
                held: me.live,
                share,
                max: me.max,
                capacity,
                proxies,
            });
        }
        if state.live >= capacity && !reclaim(&mut state, capacity, proxies, &mut reached) {
            return Err(Limit::Process {
                live: state.live,
                capacity,
                descriptors: self.budget.follows_descriptors(),
            });
        }
        state.live += 1;
        if let Some(me) = state.members.get_mut(&self.id) {
            me.live += 1;
        }
        Ok(())
    }

    /// Gives back a connection [`Seat::admit`] took (once it has ended).
    pub(crate) fn release(&self) {
        let mut state = self.budget.lock();
        state.live = state.live.saturating_sub(1);
        if let Some(me) = state.members.get_mut(&self.id) {
            me.live = me.live.saturating_sub(1);
        }
    }

    /// This proxy no longer shares the budget (the others' shares grow);
    /// its connections still ending are given back as they end.
    /// Idempotent.
    pub(crate) fn leave(&self) {
        self.budget.lock().members.remove(&self.id);
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.leave();
    }
}

/// Ends one connection of the member furthest over its share, trying the
/// next if one has none to end, and gives its place back; whether one was
/// ended. The members reached are kept in `reached`, for the caller to drop
/// once it no longer holds the budget's lock.
fn reclaim(
    state: &mut State,
    capacity: usize,
    proxies: usize,
    reached: &mut Vec<Arc<dyn Reclaim>>,
) -> bool {
    let mut over: Vec<(usize, u64)> = state
        .members
        .iter()
        .filter_map(|(id, m)| {
            let share = share_of(capacity, proxies, m.max);
            (m.live > share).then(|| (m.live - share, *id))
        })
        .collect();
    over.sort_unstable_by(|a, b| b.cmp(a));
    for (_, id) in over {
        let Some(member) = state.members.get_mut(&id) else {
            continue;
        };
        let share = share_of(capacity, proxies, member.max);
        let why = format!(
            "closed to make room for another sandbox: this one held {} connections, more than \
             its share of {share} (the process allows {capacity}, shared by {proxies} sandboxes); \
             the connection quiet the longest was closed",
            member.live
        );
        let Some(holder) = member.holder.upgrade() else {
            continue;
        };
        let ended = holder.reclaim_one(&why);
        reached.push(holder);
        if ended {
            member.live -= 1;
            state.live = state.live.saturating_sub(1);
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn the_connection_budget_keeps_descriptors_free_for_the_process() {
        // The usual soft limit: 64 connections, 768 descriptors at most.
        assert_eq!(budget_for(Some(1024)), 64);
        const { assert!(64 * FDS_PER_CONNECTION + FDS_RESERVED <= 1024) };
        // A limit below the reserve: nothing is proxied, nothing fails.
        assert_eq!(budget_for(Some(100)), 0);
        assert_eq!(budget_for(None), usize::MAX);
    }

    /// A proxy that holds `held` connections and counts what it gave up.
    struct Holder {
        held: AtomicUsize,
        reclaimed: AtomicUsize,
    }

    impl Holder {
        fn new() -> Arc<Holder> {
            Arc::new(Holder {
                held: AtomicUsize::new(0),
                reclaimed: AtomicUsize::new(0),
            })
        }
    }

    impl Reclaim for Holder {
        fn reclaim_one(&self, _why: &str) -> bool {
            let taken = self
                .held
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok();
            if taken {
                self.reclaimed.fetch_add(1, Ordering::SeqCst);
            }
            taken
        }
    }

    fn seat(budget: &ConnectionBudget, max: usize) -> (Arc<Holder>, Seat) {
        let holder = Holder::new();
        let weak: Weak<dyn Reclaim> = Arc::downgrade(&(Arc::clone(&holder) as Arc<dyn Reclaim>));
        (holder, budget.join(max, weak))
    }

    /// Admits until refused; returns how many were admitted and the refusal.
    fn fill(seat: &Seat, holder: &Holder) -> (usize, Limit) {
        let mut n = 0;
        loop {
            match seat.admit() {
                Ok(()) => {
                    holder.held.fetch_add(1, Ordering::SeqCst);
                    n += 1;
                }
                Err(limit) => return (n, limit),
            }
            assert!(n <= 1000, "never refused");
        }
    }

    #[test]
    fn each_proxy_gets_an_even_share_and_hitting_it_refuses_only_that_proxy() {
        let budget = ConnectionBudget::fixed(8);
        let (ha, a) = seat(&budget, 256);
        let (hb, b) = seat(&budget, 256);
        let (n, limit) = fill(&a, &ha);
        assert_eq!(n, 4);
        assert_eq!(limit.rule(), RULE_TOO_MANY_CONNECTIONS);
        assert!(matches!(limit, Limit::Share { share: 4, .. }), "{limit:?}");
        let (n, _) = fill(&b, &hb);
        assert_eq!(n, 4);
        assert_eq!(ha.reclaimed.load(Ordering::SeqCst), 0);
        // A connection given back is taken again.
        a.release();
        ha.held.fetch_sub(1, Ordering::SeqCst);
        assert!(a.admit().is_ok());
    }

    #[test]
    fn a_proxy_over_its_shrunken_share_gives_up_connections_to_a_newcomer() {
        let budget = ConnectionBudget::fixed(6);
        let (ha, a) = seat(&budget, 256);
        assert_eq!(fill(&a, &ha).0, 6);
        // A second and a third proxy start: the first holds 6 of a share
        // of 2.
        let (hb, b) = seat(&budget, 256);
        let (hc, c) = seat(&budget, 256);
        let (n, limit) = fill(&b, &hb);
        assert_eq!(n, 2);
        assert_eq!(limit.rule(), RULE_TOO_MANY_CONNECTIONS);
        assert_eq!(ha.reclaimed.load(Ordering::SeqCst), 2);
        assert_eq!(fill(&c, &hc).0, 2);
        assert_eq!(ha.reclaimed.load(Ordering::SeqCst), 4);
        // The first is now at its share: it gets nothing more, and gives
        // nothing more up.
        assert_eq!(fill(&a, &ha).0, 0);
        assert_eq!(budget.live(), 6);
        // When one leaves, the others' shares grow.
        drop(c);
        assert_eq!(budget.proxies(), 2);
    }

    #[test]
    fn the_process_limit_is_named_when_nothing_can_be_reclaimed() {
        let budget = ConnectionBudget::fixed(2);
        let (ha, a) = seat(&budget, 256);
        assert_eq!(fill(&a, &ha).0, 2);
        let (_hb, b) = seat(&budget, 256);
        // The first is over its share but its connections cannot be ended
        // (it is shutting down, say).
        ha.held.store(0, Ordering::SeqCst);
        let limit = b.admit().unwrap_err();
        assert_eq!(limit.rule(), RULE_PROCESS_CONNECTIONS);
        assert_eq!(
            limit,
            Limit::Process {
                live: 2,
                capacity: 2,
                descriptors: false,
            }
        );
    }

    #[test]
    fn a_proxys_own_limit_caps_its_share() {
        let budget = ConnectionBudget::fixed(100);
        let (ha, a) = seat(&budget, 3);
        let (n, limit) = fill(&a, &ha);
        assert_eq!(n, 3);
        assert!(
            matches!(
                limit,
                Limit::Share {
                    max: 3,
                    share: 3,
                    ..
                }
            ),
            "{limit:?}"
        );
        assert!(limit.message().contains("its own limit, 3"), "{limit:?}");
    }

    /// A proxy whose last handle is the one a reclaim takes: it goes away
    /// as it gives up a connection.
    struct Leaving {
        seat: OnceLock<Seat>,
        itself: Mutex<Option<Arc<Leaving>>>,
    }

    impl Reclaim for Leaving {
        fn reclaim_one(&self, _why: &str) -> bool {
            self.itself.lock().unwrap().take();
            true
        }
    }

    #[test]
    fn a_proxy_going_away_as_it_gives_up_a_connection_does_not_lock_the_budget_up() {
        let budget = ConnectionBudget::fixed(2);
        let leaving = Arc::new(Leaving {
            seat: OnceLock::new(),
            itself: Mutex::new(None),
        });
        let weak: Weak<dyn Reclaim> = Arc::downgrade(&(Arc::clone(&leaving) as Arc<dyn Reclaim>));
        let seat = leaving.seat.get_or_init(|| budget.join(256, weak));
        assert!(seat.admit().is_ok() && seat.admit().is_ok());
        *leaving.itself.lock().unwrap() = Some(Arc::clone(&leaving));
        drop(leaving);
        let (_hb, b) = seat_of(&budget);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send((b.admit(), b));
        });
        let (admitted, _b) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the budget's lock was taken twice");
        assert!(admitted.is_ok());
        // The first proxy left as it went away; the second holds one.
        assert_eq!((budget.proxies(), budget.live()), (1, 2));
    }

    fn seat_of(budget: &ConnectionBudget) -> (Arc<Holder>, Seat) {
        seat(budget, 256)
    }

    #[test]
    fn a_proxy_that_left_is_refused_and_its_ending_connections_are_given_back() {
        let budget = ConnectionBudget::fixed(4);
        let (ha, a) = seat(&budget, 256);
        assert!(a.admit().is_ok());
        ha.held.fetch_add(1, Ordering::SeqCst);
        a.leave();
        assert_eq!(budget.proxies(), 0);
        assert!(a.admit().is_err());
        assert_eq!(budget.live(), 1);
        a.release();
        assert_eq!(budget.live(), 0);
    }
}
