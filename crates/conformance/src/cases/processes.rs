//! Long-lived processes with handles: output read back from offsets, live
//! stdin, a memoised end, idempotent kills, three clocks kept apart, and
//! terminals.

use std::time::{Duration, Instant};

use hako_core::{
    Command, Error, ExitStatus, ProcessId, Processes, Sandbox, SpawnOptions, Stream, TermSize,
};

use crate::check::{show, Ctx, Res};
use crate::procs::sandbox_processes_with_arg;
use crate::Outcome;

fn processes(sb: &dyn Sandbox) -> Res<&dyn Processes> {
    match sb.processes() {
        Some(p) => Ok(p),
        None => Err(Outcome::Skipped(format!(
            "the {} backend offers no long-lived processes",
            sb.capabilities().backend
        ))),
    }
}

/// Reads `stream` from `offset` until `want` bytes have come or the stream
/// ends (waiting at most `limit` in all).
fn read_until(
    p: &dyn Processes,
    id: ProcessId,
    stream: Stream,
    mut offset: u64,
    want: usize,
    limit: Duration,
) -> Res<Vec<u8>> {
    let start = Instant::now();
    let mut got = Vec::new();
    while got.len() < want {
        let slice = p
            .read_output(
                id,
                stream,
                offset,
                1 << 20,
                Some(Duration::from_millis(200)),
            )
            .ctx("read output")?;
        ensure_eq!(slice.lost, 0, "bytes lost at offset {offset}");
        ensure_eq!(slice.offset, offset, "the slice starts where asked");
        got.extend_from_slice(&slice.data);
        offset = slice.next;
        if slice.ended {
            break;
        }
        ensure!(
            start.elapsed() < limit,
            "only {} of {want} bytes within {limit:?}: {}",
            got.len(),
            show(&got)
        );
    }
    Ok(got)
}

case! {
    /// A process's output is read back from any offset, however often; its
    /// end is memoised; it is listed with its tags; killing it after it
    /// ended does nothing.
    fn process_output_is_read_from_offsets_and_its_end_is_memoised(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let script = "for i in 1 2 3 4 5; do echo line$i; sleep 0.05; done; echo err >&2; exit 4";
        let id = p
            .spawn(
                &Command::shell(script),
                &SpawnOptions {
                    tags: vec!["reader".into()],
                    ..SpawnOptions::default()
                },
            )
            .ctx("spawn")?;
        let all = "line1\nline2\nline3\nline4\nline5\n";
        let got = read_until(p, id, Stream::Stdout, 0, all.len(), Duration::from_secs(20))?;
        ensure_eq!(show(&got), show(all.as_bytes()), "stdout from offset 0");
        // A caller that went away comes back and reads from where it was.
        let again = read_until(p, id, Stream::Stdout, 6, all.len() - 6, Duration::from_secs(20))?;
        ensure_eq!(show(&again), show(&all.as_bytes()[6..]), "stdout from offset 6");
        let end = p.wait(id, None).ctx("wait")?;
        ensure_eq!(end.status, Some(ExitStatus::Code(4)), "the exit status");
        ensure_eq!(p.wait(id, Some(Duration::ZERO)).ctx("wait again")?, end, "the memoised end");
        let err = read_until(p, id, Stream::Stderr, 0, 4, Duration::from_secs(5))?;
        ensure_eq!(show(&err), show(b"err\n"), "stderr");
        let slice = p.read_output(id, Stream::Stdout, all.len() as u64, 100, None).ctx("read at the end")?;
        ensure!(slice.ended && slice.data.is_empty(), "at the end of an ended process: {slice:?}");
        p.kill(id).ctx("kill after the end")?;
        let listed = p.list().ctx("list")?;
        let mine = listed.iter().find(|s| s.id == id).ctx("the process in the list")?;
        ensure_eq!(mine.tags, vec!["reader".to_string()], "its tags");
        ensure_eq!(mine.status, Some(ExitStatus::Code(4)), "its listed status");
        ensure_eq!(mine.stdout_total, all.len() as u64, "its stdout byte count");
        Ok(())
    }
}

case! {
    /// A process started with a live stdin answers what it is sent, line by
    /// line, and ends when its stdin is closed (the shape of a language
    /// server over stdio).
    fn a_process_with_live_stdin_answers_each_line(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let id = p
            .spawn(
                &Command::shell("while read -r l; do echo \"got $l\"; done; echo bye"),
                &SpawnOptions {
                    live_stdin: true,
                    ..SpawnOptions::default()
                },
            )
            .ctx("spawn")?;
        let mut offset = 0;
        for word in ["alpha", "beta"] {
            p.write_stdin(id, format!("{word}\n").as_bytes()).ctx("write stdin")?;
            let want = format!("got {word}\n");
            let got = read_until(p, id, Stream::Stdout, offset, want.len(), Duration::from_secs(20))?;
            ensure_eq!(show(&got), show(want.as_bytes()), "the answer to {word}");
            offset += got.len() as u64;
        }
        p.close_stdin(id).ctx("close stdin")?;
        let got = read_until(p, id, Stream::Stdout, offset, 4, Duration::from_secs(20))?;
        ensure_eq!(show(&got), show(b"bye\n"), "after end of input");
        ensure_eq!(p.wait(id, None).ctx("wait")?.status, Some(ExitStatus::Code(0)), "the end");
        ensure!(p.write_stdin(id, b"late\n").is_err(), "writing to the stdin of an ended process");
        Ok(())
    }
}

case! {
    /// Killing a process kills everything it started (setsid too), reports
    /// it killed, and killing again is fine.
    fn killing_a_process_kills_its_tree_and_is_idempotent(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let m = h.marker();
        let id = p
            .spawn(&Command::shell(format!("sleep {m} & setsid sleep {m} & sleep {m}")), &SpawnOptions::default())
            .ctx("spawn")?;
        let start = Instant::now();
        while sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?.len() < 3 {
            ensure!(start.elapsed() < Duration::from_secs(20), "the processes never started");
            std::thread::sleep(Duration::from_millis(50));
        }
        p.kill(id).ctx("kill")?;
        let end = p.wait(id, Some(Duration::from_secs(30))).ctx("wait after kill")?;
        ensure!(end.finished(), "still running 30 s after kill: {end:?}");
        ensure!(matches!(end.status, Some(ExitStatus::Signal(_))), "the status after kill: {end:?}");
        let left = sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?;
        ensure!(left.is_empty(), "the process tree survived kill: {left:?}");
        p.kill(id).ctx("kill again")?;
        Ok(())
    }
}

case! {
    /// The caller's wait, the process deadline and the process are three
    /// things: a wait that expires leaves the process running; a deadline
    /// kills it and says so.
    fn the_callers_wait_and_the_process_deadline_are_separate_clocks(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let id = p
            .spawn(
                &Command::shell("sleep 1; echo done").timeout(Duration::from_secs(60)),
                &SpawnOptions::default(),
            )
            .ctx("spawn")?;
        let early = p.wait(id, Some(Duration::from_millis(100))).ctx("a short wait")?;
        ensure!(!early.finished(), "a short wait ended the process: {early:?}");
        let end = p.wait(id, None).ctx("wait to the end")?;
        ensure_eq!(end.status, Some(ExitStatus::Code(0)), "it ran to its end");
        ensure!(!end.timed_out, "it did not reach its deadline");
        let out = p.read_output(id, Stream::Stdout, 0, 100, None).ctx("read")?;
        ensure_eq!(show(&out.data), show(b"done\n"), "its output");
        let m = h.marker();
        let id = p
            .spawn(
                &Command::new(["sleep", m.as_str()]).timeout(Duration::from_millis(300)),
                &SpawnOptions::default(),
            )
            .ctx("spawn")?;
        let end = p.wait(id, Some(Duration::from_secs(30))).ctx("wait")?;
        ensure!(end.finished() && end.timed_out, "the deadline did not end it: {end:?}");
        Ok(())
    }
}

case! {
    /// Output past the ring is dropped oldest first, and a read from an
    /// offset no longer held says how many bytes were lost.
    fn output_past_the_ring_is_reported_lost(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let id = p
            .spawn(
                &Command::shell("head -c 5000 /dev/zero | tr '\\0' a"),
                &SpawnOptions {
                    ring_bytes: Some(1000),
                    ..SpawnOptions::default()
                },
            )
            .ctx("spawn")?;
        p.wait(id, None).ctx("wait")?;
        let slice = p.read_output(id, Stream::Stdout, 0, 1 << 20, None).ctx("read from 0")?;
        ensure_eq!((slice.offset, slice.lost, slice.data.len()), (4000, 4000, 1000), "offset, lost, kept");
        ensure!(slice.data.iter().all(|&b| b == b'a'), "the kept bytes");
        ensure_eq!(p.wait(id, None).ctx("wait")?.stdout_total, 5000, "every byte is counted");
        match p.read_output(ProcessId(u64::MAX), Stream::Stdout, 0, 1, None) {
            Err(Error::NoSuchProcess { .. }) => Ok(()),
            other => fail!("reading a process that never was: got {other:?}, expected NoSuchProcess"),
        }
    }
}

/// Reads stdout from `offset` until `needle` shows in what was read;
/// returns everything read and the offset after it.
fn read_for(p: &dyn Processes, id: ProcessId, offset: u64, needle: &str) -> Res<(String, u64)> {
    let start = Instant::now();
    let mut offset = offset;
    let mut got = Vec::new();
    loop {
        let slice = p
            .read_output(
                id,
                Stream::Stdout,
                offset,
                1 << 16,
                Some(Duration::from_millis(200)),
            )
            .ctx("read terminal output")?;
        got.extend_from_slice(&slice.data);
        offset = slice.next;
        let text = String::from_utf8_lossy(&got).into_owned();
        if text.contains(needle) {
            return Ok((text, offset));
        }
        ensure!(
            !slice.ended,
            "the terminal ended before {needle:?} showed: {text:?}"
        );
        ensure!(
            start.elapsed() < Duration::from_secs(20),
            "{needle:?} never showed: {text:?}"
        );
    }
}

case! {
    /// A process on a terminal sees a terminal of the size asked, reads
    /// what is typed (echoed back, as terminals do), and sees a resize.
    fn a_process_on_a_terminal_sees_a_tty_its_size_and_typed_input(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let script = "tty; stty size; read -r x; echo \"got [$x]\"; read -r y; stty size";
        let id = p
            .spawn(
                &Command::shell(script),
                &SpawnOptions {
                    pty: Some(TermSize { rows: 24, cols: 80 }),
                    ..SpawnOptions::default()
                },
            )
            .ctx("spawn on a terminal")?;
        let (text, offset) = read_for(p, id, 0, "24 80")?;
        ensure!(text.contains("/dev/pts/"), "tty does not name a terminal: {text:?}");
        p.write_stdin(id, b"hello\n").ctx("type a line")?;
        let (text, offset) = read_for(p, id, offset, "got [hello]")?;
        ensure!(text.contains("hello\r\n"), "the terminal did not echo the input: {text:?}");
        p.resize(id, TermSize { rows: 30, cols: 100 }).ctx("resize")?;
        p.write_stdin(id, b"\n").ctx("type enter")?;
        read_for(p, id, offset, "30 100")?;
        let end = p.wait(id, Some(Duration::from_secs(20))).ctx("wait")?;
        ensure_eq!(end.status, Some(ExitStatus::Code(0)), "the end");
        let plain = p.spawn(&Command::new(["true"]), &SpawnOptions::default()).ctx("spawn")?;
        ensure!(p.resize(plain, TermSize { rows: 5, cols: 5 }).is_err(), "resizing a process without a terminal");
        Ok(())
    }
}

case! {
    /// Ctrl-C typed on the terminal interrupts the program on it; a
    /// terminal process past its deadline is killed with its whole group.
    fn ctrl_c_reaches_the_terminal_program_and_deadlines_kill_it(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        let tty = SpawnOptions {
            pty: Some(TermSize { rows: 24, cols: 80 }),
            ..SpawnOptions::default()
        };
        let m = h.marker();
        let id = p
            .spawn(&Command::shell(format!("echo ready; sleep {m}")), &tty)
            .ctx("spawn on a terminal")?;
        read_for(p, id, 0, "ready")?;
        let start = Instant::now();
        while sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?.is_empty() {
            ensure!(start.elapsed() < Duration::from_secs(20), "sleep never started");
            std::thread::sleep(Duration::from_millis(20));
        }
        p.write_stdin(id, b"\x03").ctx("type Ctrl-C")?;
        let end = p.wait(id, Some(Duration::from_secs(20))).ctx("wait after Ctrl-C")?;
        ensure!(
            matches!(end.status, Some(ExitStatus::Signal(2)) | Some(ExitStatus::Code(130))),
            "Ctrl-C did not interrupt it: {end:?}"
        );
        let m = h.marker();
        let id = p
            .spawn(
                &Command::shell(format!("sleep {m} & sleep {m}")).timeout(Duration::from_millis(300)),
                &tty,
            )
            .ctx("spawn on a terminal with a deadline")?;
        let end = p.wait(id, Some(Duration::from_secs(30))).ctx("wait")?;
        ensure!(end.finished() && end.timed_out, "the deadline did not end it: {end:?}");
        let left = sandbox_processes_with_arg(sb, &m).ctx("scan /proc inside")?;
        ensure!(left.is_empty(), "processes of the terminal survived its deadline: {left:?}");
        Ok(())
    }
}

case! {
    /// The caller's wait: a command that ends in time comes back as its
    /// output; one that does not comes back as a handle with the output so
    /// far, and keeps running to its end.
    fn a_callers_wait_that_expires_returns_a_handle_and_the_output_so_far(h) {
        let sb = h.sandbox();
        let p = processes(sb)?;
        match hako_core::exec_or_detach(p, &Command::shell("echo quick"), Duration::from_secs(60))
            .ctx("a quick command")?
        {
            hako_core::Waited::Finished(out) => {
                ensure_eq!(show(&out.stdout), show(b"quick\n"), "its output");
                ensure_eq!(out.status, ExitStatus::Code(0), "its status");
            }
            other => fail!("a quick command did not finish within a minute: {other:?}"),
        }
        // This one cannot end before the test lets it.
        let script = "echo early; while [ ! -e go.flag ]; do sleep 0.02; done; echo late";
        let (id, so_far) = match hako_core::exec_or_detach(p, &Command::shell(script), Duration::from_millis(300))
            .ctx("a command that outlives the wait")?
        {
            hako_core::Waited::Running { id, stdout, .. } => (id, stdout),
            other => fail!("it ended before it was let: {other:?}"),
        };
        ensure!(b"early\n".starts_with(&so_far.data), "the output so far: {}", show(&so_far.data));
        h.plant_file("go.flag", b"")?;
        let end = p.wait(id, Some(Duration::from_secs(30))).ctx("wait for the rest")?;
        ensure_eq!(end.status, Some(ExitStatus::Code(0)), "it ran to its end");
        let all = read_until(p, id, Stream::Stdout, 0, 11, Duration::from_secs(10))?;
        ensure_eq!(show(&all), show(b"early\nlate\n"), "everything it wrote");
        Ok(())
    }
}
