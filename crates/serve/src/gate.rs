//! Commands start in turn. Under load, every command's start is a chain of
//! processes woken one after another (the server's thread, the guest, a
//! supervisor, the command itself); with more chains running at once than
//! there are CPUs, the scheduler interleaves them and a few wait behind
//! many others: the median stays low but the slowest hundredth took ten
//! times as long. At most [`width`] commands start at once, the rest wait
//! in the order they came. A command counts as starting until it ends or
//! [`WINDOW`] has passed, so a long-running one holds its turn only
//! briefly and never keeps others from starting.

use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How long a command counts as starting, at most.
pub(crate) const WINDOW: Duration = Duration::from_millis(10);

/// Commands that may start at once: two per CPU. A start is mostly its
/// processes waiting for one another, each chain keeping about half a CPU
/// busy: two per CPU keep every CPU busy (measured with `hako bench
/// --load` on two CPUs: one per CPU lost a tenth of the throughput, two
/// lost none and halved the slowest hundredth).
pub(crate) fn width() -> usize {
    2 * std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The turns.
pub(crate) struct StartGate {
    turns: Arc<Semaphore>,
    window: Duration,
}

/// A turn, given back when dropped or when the window has passed.
pub(crate) struct Turn {
    _held: Arc<Mutex<Option<OwnedSemaphorePermit>>>,
}

impl StartGate {
    pub(crate) fn new(width: usize, window: Duration) -> Self {
        StartGate {
            turns: Arc::new(Semaphore::new(width.max(1))),
            window,
        }
    }

    /// Waits for a turn (first come, first served).
    pub(crate) async fn enter(&self) -> Turn {
        // The semaphore is never closed: a turn always comes.
        let permit = Arc::clone(&self.turns).acquire_owned().await.ok();
        let held = Arc::new(Mutex::new(permit));
        let weak: Weak<_> = Arc::downgrade(&held);
        let window = self.window;
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            if let Some(held) = weak.upgrade() {
                drop(held.lock().unwrap_or_else(|p| p.into_inner()).take());
            }
        });
        Turn { _held: held }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_held_past_the_window_lets_the_next_command_start() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let gate = StartGate::new(1, Duration::from_millis(20));
            let first = gate.enter().await;
            // The first still runs; the second gets its turn once the
            // window has passed.
            let second = tokio::time::timeout(Duration::from_secs(30), gate.enter()).await;
            assert!(second.is_ok(), "the window never gave the turn back");
            drop(first);
        });
    }

    #[test]
    fn a_turn_given_back_lets_the_next_start_in_the_order_they_came() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            // A window far longer than the test: only giving back frees a turn.
            let gate = Arc::new(StartGate::new(1, Duration::from_secs(3600)));
            let first = gate.enter().await;
            let order = Arc::new(Mutex::new(Vec::new()));
            let mut waiting = Vec::new();
            for i in 0..3 {
                let (gate, order) = (Arc::clone(&gate), Arc::clone(&order));
                waiting.push(tokio::spawn(async move {
                    let turn = gate.enter().await;
                    order.lock().unwrap().push(i);
                    drop(turn);
                }));
                // Each queues before the next is spawned.
                tokio::task::yield_now().await;
            }
            assert!(
                order.lock().unwrap().is_empty(),
                "a turn was given while held"
            );
            drop(first);
            for w in waiting {
                w.await.unwrap();
            }
            assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
        });
    }
}
