//! A client of QEMU's machine protocol (QMP), over one end of a socket
//! pair whose other end QEMU got at its start (`-chardev socket,fd=3`):
//! no socket file anyone else could reach, nothing left on disk.
//!
//! hako uses it to restore a VM from a snapshot, to take one, and to add
//! the virtio-fs devices once the VM runs; descriptors (the snapshot
//! file, a share's socket) go to QEMU with `getfd`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// How long one answer may take (a guard against a hung QEMU).
const ANSWER_WAIT: Duration = Duration::from_secs(60);

/// A QMP connection, capabilities negotiated.
#[derive(Debug)]
pub struct Qmp {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// Events seen while waiting for answers, oldest first.
    events: Vec<Value>,
}

fn protocol(message: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.into())
}

impl Qmp {
    /// Reads QEMU's greeting and leaves capabilities negotiation mode.
    pub fn connect(stream: UnixStream) -> io::Result<Qmp> {
        stream.set_read_timeout(Some(ANSWER_WAIT))?;
        let reader = BufReader::new(stream.try_clone()?);
        let mut qmp = Qmp {
            stream,
            reader,
            events: Vec::new(),
        };
        let greeting = qmp.read()?;
        if greeting.get("QMP").is_none() {
            return Err(protocol(format!("QEMU greeted with {greeting}")));
        }
        qmp.execute("qmp_capabilities", None)?;
        Ok(qmp)
    }

    fn read(&mut self) -> io::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "QEMU closed its QMP socket",
            ));
        }
        serde_json::from_str(&line).map_err(|e| protocol(format!("QEMU's QMP said {line:?}: {e}")))
    }

    /// Runs `command`, returning its `return` value; QEMU's `error` is an
    /// error naming the command.
    pub fn execute(&mut self, command: &str, arguments: Option<Value>) -> io::Result<Value> {
        self.execute_with_fd(command, arguments, None)
    }

    /// [`execute`](Self::execute), passing `fd` with the command (for
    /// `getfd`).
    pub fn execute_with_fd(
        &mut self,
        command: &str,
        arguments: Option<Value>,
        fd: Option<BorrowedFd<'_>>,
    ) -> io::Result<Value> {
        let mut message = json!({ "execute": command });
        if let Some(arguments) = arguments {
            message["arguments"] = arguments;
        }
        let bytes = serde_json::to_vec(&message).map_err(|e| protocol(e.to_string()))?;
        match fd {
            Some(fd) => hako_proto::send_with_fds(&self.stream, &bytes, &[fd])?,
            None => (&self.stream).write_all(&bytes)?,
        }
        loop {
            let answer = self.read()?;
            if answer.get("event").is_some() {
                self.events.push(answer);
                continue;
            }
            if let Some(value) = answer.get("return") {
                return Ok(value.clone());
            }
            let why = answer
                .pointer("/error/desc")
                .and_then(Value::as_str)
                .unwrap_or("no reason given");
            return Err(io::Error::other(format!("QEMU refused {command}: {why}")));
        }
    }

    /// Waits for the first event for which `wanted` holds (seen before or
    /// read now), for at most `within`.
    pub fn wait_event(
        &mut self,
        within: Duration,
        wanted: impl Fn(&Value) -> bool,
    ) -> io::Result<Value> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.events.iter().position(&wanted) {
                return Ok(self.events.remove(i));
            }
            let left = within.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "QEMU did not report the event in time",
                ));
            }
            self.stream.set_read_timeout(Some(left))?;
            let read = self.read();
            self.stream.set_read_timeout(Some(ANSWER_WAIT))?;
            match read {
                Ok(event) if event.get("event").is_some() => self.events.push(event),
                Ok(other) => return Err(protocol(format!("QEMU said {other} unasked"))),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Asks `command` again every few milliseconds until `done` says the
    /// answer is final (`Ok(true)`) or failed (`Err`), for at most
    /// `within`.
    pub fn poll(
        &mut self,
        command: &str,
        within: Duration,
        done: impl Fn(&Value) -> Result<bool, String>,
    ) -> io::Result<Value> {
        let start = Instant::now();
        loop {
            let answer = self.execute(command, None)?;
            match done(&answer) {
                Ok(true) => return Ok(answer),
                Ok(false) => {}
                Err(why) => return Err(io::Error::other(why)),
            }
            if start.elapsed() > within {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("QEMU's {command} did not finish in {within:?}: {answer}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
