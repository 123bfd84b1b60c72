//! Frames from the guest: handing each to the command it belongs to (or
//! to a long-lived process's record), telling every waiter when the guest
//! is gone, and who reads (a reader thread, or the waiting threads taking
//! turns).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{RecvTimeoutError, TryRecvError};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::{Connection, HELLO_ID};
use crate::processes::Procs;
use crate::proto::{self, Frame, FromGuest, StreamId};

/// What the reader thread hands a waiting command.
pub(super) enum Event {
    Output { stream: StreamId, data: Vec<u8> },
    Done(FromGuest),
    Gone(String),
}

#[derive(Default)]
pub(super) struct Table {
    pub(super) waiting: HashMap<u64, mpsc::Sender<Event>>,
    /// Long-lived processes: their output and end are kept here.
    pub(super) procs: Procs,
    /// The guest said [`FromGuest::Bye`].
    pub(super) bye: bool,
    /// Why the guest is gone, once it is.
    pub(super) gone: Option<String>,
    /// Sessions asked for (a shell may still run in one).
    pub(super) sessions_opened: u64,
}

/// The table, and a signal for those waiting on a process's output or end.
#[derive(Default)]
pub(super) struct Shared {
    pub(super) table: Mutex<Table>,
    pub(super) changed: Condvar,
}

/// Who reads what the guest sends.
pub(super) enum ReadBy {
    /// A reader thread, or nobody any more (the guest is gone).
    Thread,
    /// The threads that wait for the guest, one frame at a time each:
    /// `end` is here while none of them reads. `thread_wanted`: a reader
    /// thread is to take over; the thread reading starts it when done.
    Callers {
        end: Option<BufReader<UnixStream>>,
        thread_wanted: bool,
    },
}

/// How hako reads what the guest sends.
pub(super) enum ReaderEnd {
    /// A thread of its own reads it from the start.
    Thread(Box<dyn Read + Send>),
    /// Whichever thread waits reads it, until a thread of its own is
    /// needed (see [`DriverOptions::read_on_caller`](crate::DriverOptions::read_on_caller)).
    Caller(UnixStream),
}

impl Connection {
    /// The next event for the waiter of `rx`, waiting at most `timeout`
    /// (`None`: until one comes). Where no reader thread runs, the waiting
    /// threads take turns reading the guest's frames, one frame per turn,
    /// each handing on what belongs to the others, until one for `rx`
    /// comes.
    pub(super) fn next_event(
        &self,
        rx: &mpsc::Receiver<Event>,
        timeout: Option<Duration>,
    ) -> std::result::Result<Event, RecvTimeoutError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        fn gone<E>(_: E) -> RecvTimeoutError {
            RecvTimeoutError::Disconnected
        }
        let mut read_by = self.read_by.lock().map_err(gone)?;
        loop {
            // Frames are handed on under `read_by`: what came is here.
            match rx.try_recv() {
                Ok(event) => return Ok(event),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            let ReadBy::Callers { end, .. } = &mut *read_by else {
                drop(read_by);
                return match deadline {
                    None => rx.recv().map_err(gone),
                    Some(d) => rx.recv_timeout(d.saturating_duration_since(Instant::now())),
                };
            };
            let Some(mut taken) = end.take() else {
                // Another waiter is reading: its frame may be this one's.
                read_by = match deadline {
                    None => self.turn_over.wait(read_by).map_err(gone)?,
                    Some(d) => {
                        let left = d.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            return Err(RecvTimeoutError::Timeout);
                        }
                        self.turn_over.wait_timeout(read_by, left).map_err(gone)?.0
                    }
                };
                continue;
            };
            drop(read_by);
            let read = match deadline {
                Some(d) if taken.buffer().is_empty() && !readable_by(taken.get_ref(), d) => None,
                _ => Some(read_one(&mut taken, &self.shared)),
            };
            read_by = self.read_by.lock().map_err(gone)?;
            let timed_out = read.is_none();
            match read {
                Some(Err(why)) => {
                    // The guest is gone (or said goodbye): every waiter hears.
                    *read_by = ReadBy::Thread;
                    finish(&self.shared, why.to_string(), None);
                }
                Some(Ok(())) | None => self.end_turn(&mut read_by, taken),
            }
            self.turn_over.notify_all();
            if timed_out {
                return Err(RecvTimeoutError::Timeout);
            }
        }
    }

    /// Puts the guest's end back for the next waiter, or gives it to a
    /// reader thread if one is wanted.
    pub(super) fn end_turn(&self, read_by: &mut ReadBy, end: BufReader<UnixStream>) {
        match read_by {
            ReadBy::Callers {
                thread_wanted: true,
                ..
            } => {
                *read_by = ReadBy::Thread;
                self.spawn_reader(end);
            }
            ReadBy::Callers { end: slot, .. } => *slot = Some(end),
            ReadBy::Thread => {}
        }
    }

    /// Starts the reader thread on `end`. If it cannot start, nothing can
    /// read the guest any more, and every waiter is told so.
    pub(super) fn spawn_reader(&self, end: BufReader<UnixStream>) {
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("hako-{}-guest", self.backend))
            .spawn(move || read_events(end, &shared, None));
        match spawned {
            Ok(handle) => {
                if let Ok(mut reader) = self.reader.lock() {
                    *reader = Some(handle);
                }
            }
            Err(e) => finish(
                &self.shared,
                format!("cannot start the guest reader: {e}"),
                None,
            ),
        }
    }

    /// Has a reader thread take over from the waiting threads: from here
    /// on frames arrive while nobody waits (a long-lived process's output,
    /// a session's end). If a waiting thread is reading, it starts the
    /// thread when its frame is in.
    pub(super) fn start_reader_thread(&self) {
        let Ok(mut read_by) = self.read_by.lock() else {
            return;
        };
        if let ReadBy::Callers { end, thread_wanted } = &mut *read_by {
            match end.take() {
                Some(end) => {
                    *read_by = ReadBy::Thread;
                    self.spawn_reader(end);
                }
                None => *thread_wanted = true,
            }
        }
    }

    /// The guest's end, taken from the waiting threads for good once none
    /// of them reads it; `None` where a reader thread has it.
    pub(super) fn take_end(&self) -> Option<BufReader<UnixStream>> {
        let mut read_by = self.read_by.lock().ok()?;
        loop {
            match &mut *read_by {
                ReadBy::Thread => return None,
                ReadBy::Callers { end, .. } => {
                    if let Some(end) = end.take() {
                        *read_by = ReadBy::Thread;
                        return Some(end);
                    }
                }
            }
            read_by = self.turn_over.wait(read_by).ok()?;
        }
    }
}

/// The reader thread: hands every frame to the command it belongs to, and
/// tells every waiting command when the guest is gone.
pub(super) fn read_events(
    mut ctl: BufReader<impl Read>,
    shared: &Shared,
    describe: Option<&(dyn Fn() -> String + Send + Sync)>,
) {
    let why = loop {
        if let Err(why) = read_one(&mut ctl, shared) {
            break why;
        }
    };
    finish(shared, why.to_string(), describe);
}

/// Why no more frames come from the guest (see [`read_one`]); told to
/// every command still waiting.
#[derive(Debug, thiserror::Error)]
enum LinkEnded {
    /// The guest said goodbye, or its end of the connection closed.
    #[error("the sandbox's guest ended")]
    GuestEnded,
    /// The guest sent what is not a frame of the protocol: nothing after
    /// it can be trusted to be one.
    #[error("the connection to the sandbox's guest failed: {0}")]
    Protocol(#[source] std::io::Error),
    /// Reading from the connection failed.
    #[error("the connection to the sandbox's guest failed: {0}")]
    Read(#[source] std::io::Error),
    /// A thread panicked while it held the connection's state.
    #[error("the connection's state is poisoned")]
    Poisoned,
}

/// Reads one frame from the guest and hands it to the command it belongs
/// to. `Err`: why no more come (the guest said goodbye, or is gone).
fn read_one(ctl: &mut impl BufRead, shared: &Shared) -> std::result::Result<(), LinkEnded> {
    let frame = match proto::read_any::<FromGuest>(ctl) {
        Ok(frame) => frame,
        Err(e) => {
            return Err(match e.kind() {
                std::io::ErrorKind::UnexpectedEof => LinkEnded::GuestEnded,
                std::io::ErrorKind::InvalidData => LinkEnded::Protocol(e),
                _ => LinkEnded::Read(e),
            })
        }
    };
    let Ok(mut table) = shared.table.lock() else {
        return Err(LinkEnded::Poisoned);
    };
    if matches!(frame, Frame::Message(FromGuest::Bye {})) {
        table.bye = true;
        return Err(LinkEnded::GuestEnded);
    }
    match frame {
        Frame::Output {
            id, stream, data, ..
        } => {
            if let Some(tx) = table.waiting.get(&id) {
                let _ = tx.send(Event::Output { stream, data });
            } else if let Some(proc) = table.procs.map.get_mut(&id) {
                proc.output(stream_index(stream), &data);
                shared.changed.notify_all();
            }
        }
        Frame::Message(msg) => {
            let id = match &msg {
                FromGuest::Exited { id, .. }
                | FromGuest::SpawnFailed { id, .. }
                | FromGuest::SessionOpened { id }
                | FromGuest::SessionEnded { id, .. } => Some(*id),
                FromGuest::Failed { id, .. } => *id,
                FromGuest::Ready { .. } | FromGuest::Refused { .. } => Some(HELLO_ID),
                FromGuest::Bye {} => None,
            };
            if let Some(tx) = id.and_then(|id| table.waiting.remove(&id)) {
                let _ = tx.send(Event::Done(msg));
            } else if let Some(id) = id.filter(|id| table.procs.map.contains_key(id)) {
                if let Some(proc) = table.procs.map.get_mut(&id) {
                    match msg {
                        FromGuest::Exited {
                            status,
                            timed_out,
                            oom_killed,
                            ..
                        } => {
                            proc.status = Some(status);
                            proc.timed_out = timed_out;
                            proc.oom_killed = oom_killed;
                        }
                        FromGuest::SpawnFailed { message, .. }
                        | FromGuest::Failed { message, .. } => proc.error = Some(message),
                        _ => {}
                    }
                    proc.stdin_open = false;
                }
                table.procs.ended(id);
                shared.changed.notify_all();
            } else {
                // A session whose shell ended on its own, or a stray.
                tracing::debug!("hako-guest: {msg:?}");
            }
        }
        Frame::Stdin { .. } => tracing::warn!("hako-guest sent a stdin frame"),
    }
    Ok(())
}

/// Tells every waiting command, and every long-lived process still
/// running, that the guest is gone and why.
fn finish(shared: &Shared, why: String, describe: Option<&(dyn Fn() -> String + Send + Sync)>) {
    // A guest that ended without saying goodbye: say what became of it.
    let bye = shared.table.lock().is_ok_and(|t| t.bye);
    let why = match describe {
        Some(describe) if !bye => format!("{why}: {}", describe()),
        _ => why,
    };
    if let Ok(mut table) = shared.table.lock() {
        for (_, tx) in table.waiting.drain() {
            let _ = tx.send(Event::Gone(why.clone()));
        }
        for proc in table.procs.map.values_mut() {
            if !proc.finished() {
                proc.error = Some(why.clone());
                proc.lost = true;
                proc.stdin_open = false;
            }
        }
        table.gone = Some(why);
    }
    shared.changed.notify_all();
}

/// Whether `socket` has something to read (or has ended) before
/// `deadline`.
fn readable_by(socket: &UnixStream, deadline: Instant) -> bool {
    use hako_sys::rustix::event::{poll, PollFd, PollFlags, Timespec};
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(socket, PollFlags::IN)];
        match poll(&mut fds, Some(&timeout)) {
            Ok(0) => return false,
            Ok(_) => return true,
            Err(hako_sys::rustix::io::Errno::INTR) => {}
            // Let the read say what is wrong.
            Err(_) => return true,
        }
    }
}

fn stream_index(stream: StreamId) -> usize {
    match stream {
        StreamId::Stdout => 0,
        StreamId::Stderr => 1,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::io::Cursor;

    use hako_core::ExitStatus;

    use super::*;
    use crate::processes::Proc;

    fn frames(list: &[Frame<FromGuest>]) -> Cursor<Vec<u8>> {
        let mut bytes = Vec::new();
        for frame in list {
            bytes.extend(proto::encode(frame).unwrap());
        }
        Cursor::new(bytes)
    }

    fn exited(id: u64, code: i32) -> Frame<FromGuest> {
        Frame::Message(FromGuest::Exited {
            id,
            status: ExitStatus::Code(code),
            timed_out: false,
            oom_killed: false,
            stdout_total: 0,
            stderr_total: 0,
        })
    }

    fn output(id: u64, data: &[u8]) -> Frame<FromGuest> {
        Frame::Output {
            id,
            stream: StreamId::Stderr,
            offset: 0,
            data: data.to_vec(),
        }
    }

    #[test]
    fn a_commands_output_and_end_go_to_its_waiter_and_the_waiter_is_then_forgotten() {
        let shared = Shared::default();
        let (tx, rx) = mpsc::channel();
        shared.table.lock().unwrap().waiting.insert(7, tx);
        let mut input = frames(&[output(7, b"oops"), exited(7, 3)]);
        read_one(&mut input, &shared).unwrap();
        read_one(&mut input, &shared).unwrap();
        match rx.try_recv().unwrap() {
            Event::Output { stream, data } => {
                assert_eq!(stream, StreamId::Stderr);
                assert_eq!(data, b"oops");
            }
            _ => panic!("not output"),
        }
        assert!(matches!(
            rx.try_recv().unwrap(),
            Event::Done(FromGuest::Exited {
                status: ExitStatus::Code(3),
                ..
            })
        ));
        assert!(shared.table.lock().unwrap().waiting.is_empty());
    }

    #[test]
    fn a_long_lived_processs_output_and_end_are_kept_in_its_record() {
        let shared = Shared::default();
        shared
            .table
            .lock()
            .unwrap()
            .procs
            .map
            .insert(4, Proc::new(vec!["x".into()], vec![], None, true, false));
        let mut input = frames(&[output(4, b"tail"), exited(4, 0)]);
        read_one(&mut input, &shared).unwrap();
        read_one(&mut input, &shared).unwrap();
        let table = shared.table.lock().unwrap();
        let proc = &table.procs.map[&4];
        assert!(proc.finished());
        assert_eq!(proc.status, Some(ExitStatus::Code(0)));
        assert!(!proc.stdin_open);
        assert_eq!(proc.slice(1, 0, 100).data, b"tail");
    }

    #[test]
    fn the_guests_first_reply_goes_to_the_hello_waiter() {
        let shared = Shared::default();
        let (tx, rx) = mpsc::channel();
        shared.table.lock().unwrap().waiting.insert(HELLO_ID, tx);
        let mut input = frames(&[Frame::Message(FromGuest::Refused {
            message: "no".into(),
            errno: None,
        })]);
        read_one(&mut input, &shared).unwrap();
        assert!(matches!(
            rx.try_recv().unwrap(),
            Event::Done(FromGuest::Refused { .. })
        ));
    }

    #[test]
    fn goodbye_end_of_stream_and_garbage_each_end_the_link_with_their_reason() {
        let shared = Shared::default();
        let mut bye = frames(&[Frame::Message(FromGuest::Bye {})]);
        assert!(matches!(
            read_one(&mut bye, &shared),
            Err(LinkEnded::GuestEnded)
        ));
        assert!(shared.table.lock().unwrap().bye);
        let mut empty = Cursor::new(Vec::new());
        assert!(matches!(
            read_one(&mut empty, &Shared::default()),
            Err(LinkEnded::GuestEnded)
        ));
        // A length prefix that promises more than any frame may hold.
        let mut garbage = Cursor::new(vec![0xff; 64]);
        assert!(matches!(
            read_one(&mut garbage, &Shared::default()),
            Err(LinkEnded::Protocol(_) | LinkEnded::Read(_))
        ));
    }

    #[test]
    fn when_the_guest_is_gone_every_waiter_and_running_process_hears_why() {
        let shared = Shared::default();
        let (tx, rx) = mpsc::channel();
        {
            let mut table = shared.table.lock().unwrap();
            table.waiting.insert(2, tx);
            table
                .procs
                .map
                .insert(3, Proc::new(vec!["x".into()], vec![], None, true, false));
        }
        let describe = || "the container was killed".to_string();
        finish(&shared, "it ended".into(), Some(&describe));
        let why = "it ended: the container was killed";
        assert!(matches!(rx.try_recv().unwrap(), Event::Gone(w) if w == why));
        let table = shared.table.lock().unwrap();
        assert_eq!(table.gone.as_deref(), Some(why));
        assert_eq!(table.procs.map[&3].error.as_deref(), Some(why));
        assert!(table.procs.map[&3].lost);
        assert!(!table.procs.map[&3].stdin_open);
        assert!(table.waiting.is_empty());
    }

    #[test]
    fn after_a_goodbye_the_reason_is_not_described() {
        let shared = Shared::default();
        shared.table.lock().unwrap().bye = true;
        let describe = || "never asked".to_string();
        finish(&shared, "it ended".into(), Some(&describe));
        assert_eq!(
            shared.table.lock().unwrap().gone.as_deref(),
            Some("it ended")
        );
    }
}
