//! hako's record of the long-lived processes of a sandbox: their output in
//! bounded rings numbered by byte offset, and their end, memoised.

use std::collections::{BTreeMap, VecDeque};

use hako_core::{ExitStatus, OutputSlice, ProcessId, ProcessState};

/// How many ended processes are remembered; older ones are forgotten.
pub(crate) const REMEMBER_ENDED: usize = 256;
/// Default bytes of stdout kept per process.
pub(crate) const DEFAULT_RING: usize = 1 << 20;
/// The least stderr tail kept.
const MIN_TAIL: usize = 64 << 10;

/// The last `cap` bytes of a stream, numbered from the stream's start.
#[derive(Debug)]
pub(crate) struct Ring {
    data: VecDeque<u8>,
    /// Offset of `data[0]` in the stream.
    start: u64,
    cap: usize,
}

impl Ring {
    pub(crate) fn new(cap: usize) -> Self {
        Ring {
            data: VecDeque::new(),
            start: 0,
            cap: cap.max(1),
        }
    }

    pub(crate) fn push(&mut self, bytes: &[u8]) {
        self.data.extend(bytes);
        let over = self.data.len().saturating_sub(self.cap);
        self.data.drain(..over);
        self.start += over as u64;
    }

    /// Offset just past the last byte.
    pub(crate) fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    /// Up to `max` bytes from `offset`: the bytes, where they start, and
    /// how many asked for were dropped already.
    pub(crate) fn slice(&self, offset: u64, max: usize) -> (Vec<u8>, u64, u64) {
        let from = offset.clamp(self.start, self.end());
        let lost = from.saturating_sub(offset);
        let skip = usize::try_from(from - self.start).unwrap_or(usize::MAX);
        let data = self.data.iter().skip(skip).take(max).copied().collect();
        (data, from, lost)
    }
}

/// One long-lived process.
#[derive(Debug)]
pub(crate) struct Proc {
    pub argv: Vec<String>,
    pub tags: Vec<String>,
    pub rings: [Ring; 2],
    pub status: Option<ExitStatus>,
    pub error: Option<String>,
    /// It was still running when the sandbox was lost (`error` says why).
    pub lost: bool,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub stdin_open: bool,
    /// It runs on a terminal.
    pub tty: bool,
}

impl Proc {
    pub(crate) fn new(
        argv: Vec<String>,
        tags: Vec<String>,
        ring: Option<usize>,
        stdin_open: bool,
        tty: bool,
    ) -> Self {
        let ring = ring.unwrap_or(DEFAULT_RING);
        Proc {
            argv,
            tags,
            rings: [Ring::new(ring), Ring::new((ring / 4).max(MIN_TAIL))],
            status: None,
            error: None,
            lost: false,
            timed_out: false,
            oom_killed: false,
            stdin_open,
            tty,
        }
    }

    pub(crate) fn finished(&self) -> bool {
        self.status.is_some() || self.error.is_some()
    }

    pub(crate) fn output(&mut self, s: usize, data: &[u8]) {
        self.rings[s].push(data);
    }

    pub(crate) fn state(&self, id: u64) -> ProcessState {
        ProcessState {
            id: ProcessId(id),
            argv: self.argv.clone(),
            tags: self.tags.clone(),
            status: self.status,
            error: self.error.clone(),
            timed_out: self.timed_out,
            oom_killed: self.oom_killed,
            // A ring numbers every byte its stream ever had.
            stdout_total: self.rings[0].end(),
            stderr_total: self.rings[1].end(),
        }
    }

    pub(crate) fn slice(&self, s: usize, offset: u64, max: usize) -> OutputSlice {
        let (data, from, lost) = self.rings[s].slice(offset, max);
        let next = from + data.len() as u64;
        OutputSlice {
            ended: self.finished() && next >= self.rings[s].end(),
            data,
            offset: from,
            lost,
            next,
        }
    }
}

/// Every process of a sandbox, and the order the ended ones ended in.
#[derive(Debug, Default)]
pub(crate) struct Procs {
    pub map: BTreeMap<u64, Proc>,
    ended: VecDeque<u64>,
}

impl Procs {
    /// Notes that `id` ended; forgets the oldest ended ones past the limit.
    pub(crate) fn ended(&mut self, id: u64) {
        self.ended.push_back(id);
        while self.ended.len() > REMEMBER_ENDED {
            if let Some(old) = self.ended.pop_front() {
                self.map.remove(&old);
            }
        }
    }

    /// Whether any process still runs (activity, for an idle lease).
    pub(crate) fn any_running(&self) -> bool {
        self.map.values().any(|p| !p.finished())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_keeps_the_last_bytes_and_numbers_them() {
        let mut ring = Ring::new(4);
        ring.push(b"abc");
        assert_eq!(ring.slice(0, 10), (b"abc".to_vec(), 0, 0));
        ring.push(b"defg");
        assert_eq!(ring.end(), 7);
        // Asked from 0: bytes 0..3 are gone.
        assert_eq!(ring.slice(0, 10), (b"defg".to_vec(), 3, 3));
        assert_eq!(ring.slice(5, 1), (b"f".to_vec(), 5, 0));
        // Past the end: nothing, at the end.
        assert_eq!(ring.slice(9, 10), (Vec::new(), 7, 0));
    }
}
