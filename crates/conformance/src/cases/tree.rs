//! Deadlines and process trees: nothing a command started outlives it.
//!
//! Leftovers are looked for twice: in the host's `/proc` and, through a
//! follow-up `exec`, in the sandbox's own `/proc` (its pid namespace may be
//! its own, and a VM's processes are not on the host at all).

use std::time::{Duration, Instant};

use hako_core::{Command, Error, ExitStatus, Sandbox};

use hako_core::Output;

use crate::check::{expect_output, run, sh, show, still_works, within, Ctx, Res};
use crate::procs::{host_processes_with_arg, sandbox_processes_with_arg};
use crate::Outcome;

/// A hang guard, never a performance assertion.
const HANG_GUARD: Duration = Duration::from_secs(30);

/// Fails if a process with one of `markers` is alive, seen from the host or
/// from inside `sandbox`.
fn none_left(sandbox: &dyn Sandbox, markers: &[&str], after: &str) -> Res {
    for m in markers {
        let host = host_processes_with_arg(m);
        ensure!(
            host.is_empty(),
            "after {after}, processes with marker {m} remain on the host: {host:?}"
        );
        let inside = sandbox_processes_with_arg(sandbox, m).ctx("scan /proc inside")?;
        ensure!(
            inside.is_empty(),
            "after {after}, processes with marker {m} remain inside: {inside:?}"
        );
    }
    Ok(())
}

/// Polls the sandbox's `/proc` (from a concurrent exec) until a process
/// with each marker is running.
fn wait_until_running(sandbox: &dyn Sandbox, markers: &[&str], limit: Duration) -> Res {
    let start = Instant::now();
    let mut missing: Vec<&str> = markers.to_vec();
    while !missing.is_empty() {
        let mut still = Vec::new();
        for m in missing {
            if sandbox_processes_with_arg(sandbox, m)
                .ctx("scan /proc inside while the command runs")?
                .is_empty()
            {
                still.push(m);
            }
        }
        missing = still;
        if missing.is_empty() {
            break;
        }
        ensure!(
            start.elapsed() < limit,
            "processes with markers {missing:?} never appeared inside within {limit:?}, so the check would prove nothing"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

case! {
    /// A deadline kills the whole tree: a background child, one that called
    /// `setsid`, a double-forked orphan and the main process, all ignoring
    /// SIGTERM. The output says `timed_out`, keeps what was written, and the
    /// sandbox keeps working.
    fn timeout_kills_the_whole_process_tree(h) {
        let (a, b, c, d) = (h.marker(), h.marker(), h.marker(), h.marker());
        let script = format!(
            "trap '' TERM HUP INT; echo before; sleep {a} & setsid sleep {b} & (sleep {d} &); exec sleep {c}"
        );
        let timeout = Duration::from_secs(5);
        let markers = [a.as_str(), b.as_str(), c.as_str(), d.as_str()];
        let start = Instant::now();
        let (result, seen) = std::thread::scope(|scope| {
            let runner = scope.spawn(|| h.sandbox().exec(&Command::shell(&script).timeout(timeout)));
            let seen = wait_until_running(h.sandbox(), &markers, timeout - Duration::from_millis(500));
            let result = runner
                .join()
                .unwrap_or_else(|_| Err(Error::InvalidCommand { reason: "exec panicked".into() }));
            (result, seen)
        });
        let elapsed = start.elapsed();
        let out = result.ctx("exec with a deadline")?;
        seen?;
        ensure!(out.timed_out, "timed_out is false: {out:?}");
        ensure_eq!(out.status, ExitStatus::Signal(9), "status of a main process that ignores SIGTERM");
        ensure_eq!(out.stdout.as_slice(), b"before\n".as_slice(), "output written before the deadline");
        ensure!(
            elapsed >= timeout && out.duration >= timeout,
            "the deadline fired early: {elapsed:?} (reported {:?}) for a {timeout:?} timeout",
            out.duration
        );
        ensure!(elapsed < HANG_GUARD, "exec took {elapsed:?} for a {timeout:?} timeout");
        none_left(h.sandbox(), &markers, "the deadline")?;
        still_works(h, "a timeout")
    }
}

case! {
    /// A command that exits at once returns at once, even with children left
    /// in the background (holding its stdout, or detached from it with
    /// `setsid` and redirections), and those children are killed.
    fn background_children_are_killed_when_the_command_exits(h) {
        let (a, b, c) = (h.marker(), h.marker(), h.marker());
        let scripts = [
            (a.clone(), format!("sleep {a} & echo done")),
            (b.clone(), format!("sleep {b} </dev/null >/dev/null 2>&1 & echo done")),
            (c.clone(), format!("setsid sleep {c} </dev/null >/dev/null 2>&1 & echo done")),
        ];
        for (marker, script) in &scripts {
            let start = Instant::now();
            let out = run(h, &Command::shell(script))?;
            let elapsed = start.elapsed();
            expect_output(&out, b"done\n", script)?;
            ensure!(elapsed < HANG_GUARD, "{script:?} took {elapsed:?}");
            none_left(h.sandbox(), &[marker.as_str()], script)?;
        }
        Ok(())
    }
}

case! {
    /// `close()` while a command runs (no deadline) ends that command, and no
    /// process is left, on the host or in a new sandbox on the workspace.
    fn close_during_exec_kills_the_command(h) {
        let m = h.marker();
        let (tx, rx) = std::sync::mpsc::channel();
        let outcome: Res = std::thread::scope(|scope| {
            let command = Command::new(["sleep", m.as_str()]);
            let sandbox = h.sandbox();
            scope.spawn(move || {
                let _ = tx.send(sandbox.exec(&command));
            });
            wait_until_running(sandbox, &[m.as_str()], Duration::from_secs(10))?;
            sandbox.close().ctx("close while a command runs")?;
            match rx.recv_timeout(HANG_GUARD) {
                Ok(Ok(out)) => ensure!(
                    matches!(out.status, ExitStatus::Signal(_)),
                    "the command survived close(): {:?} stdout {}",
                    out.status,
                    show(&out.stdout)
                ),
                Ok(Err(_)) => {}
                Err(_) => {
                    return Err(Outcome::Failed(format!(
                        "exec did not return within {HANG_GUARD:?} of close()"
                    )))
                }
            }
            Ok(())
        });
        outcome?;
        let host = host_processes_with_arg(&m);
        ensure!(host.is_empty(), "after close(), the command is alive on the host: {host:?}");
        let fresh = h.new_sandbox().ctx("build a new sandbox on the workspace")?;
        let inside = sandbox_processes_with_arg(fresh.as_ref(), &m).ctx("scan /proc inside");
        fresh.close().ctx("close the new sandbox")?;
        let inside = inside?;
        ensure!(inside.is_empty(), "after close(), the command is alive inside: {inside:?}");
        match h.sandbox().exec(&Command::new(["true"])) {
            Err(Error::Closed) => Ok(()),
            other => fail!("exec after close(): got {other:?}, expected Closed"),
        }
    }
}

case! {
    /// A command stops the supervisor that watches its deadline (its parent:
    /// it may signal any process of its uid). The deadline still kills it,
    /// and the sandbox keeps working.
    fn stopping_its_supervisor_does_not_let_a_command_outlive_its_deadline(h) {
        let m = h.marker();
        let script = format!("kill -STOP $PPID; echo stopped; exec sleep {m}");
        let timeout = Duration::from_secs(3);
        let start = Instant::now();
        let out = within(
            HANG_GUARD,
            "an exec whose supervisor was stopped",
            || h.sandbox().exec(&Command::shell(&script).timeout(timeout)),
            || {
                let _ = h.sandbox().close();
            },
        )?
        .ctx("exec that stops its supervisor")?;
        let elapsed = start.elapsed();
        ensure!(out.timed_out, "the deadline did not fire: {out:?}");
        ensure_eq!(out.stdout.as_slice(), b"stopped\n".as_slice(), "output before the deadline");
        ensure!(elapsed >= timeout, "the deadline fired early: {elapsed:?}");
        none_left(h.sandbox(), &[m.as_str()], "the deadline")?;
        still_works(h, "a command stopped its supervisor")
    }
}

case! {
    /// A command stops every other child of the sandbox's guest: the
    /// supervisors waiting, idle, for the next commands. The commands that
    /// follow, several at once and each too large to wait unread in a
    /// supervisor's socket, still run, on those very supervisors, and
    /// return.
    fn stopping_the_idle_supervisors_does_not_hang_the_next_commands(h) {
        // Several at once first, so that supervisors are left idle.
        let warm: Vec<Res<Output>> = std::thread::scope(|scope| {
            let runs: Vec<_> = (0..3)
                .map(|_| scope.spawn(|| sh(h, "sleep 0.3; echo warm")))
                .collect();
            runs.into_iter()
                .map(|r| r.join().unwrap_or_else(|_| Err(Outcome::Failed("exec panicked".into()))))
                .collect()
        });
        for out in warm {
            expect_output(&out?, b"warm\n", "a concurrent exec")?;
        }
        // The guest is the supervisor's parent; stop each of its other
        // children (on `host` these are the only processes touched), again
        // and again for two seconds, and name every one stopped.
        let attack = "guest=$(cut -d' ' -f4 /proc/$PPID/stat); seen=' '; end=$(($(date +%s) + 2)); \
            while [ $(date +%s) -le $end ]; do \
            for d in /proc/[0-9]*; do p=${d#/proc/}; \
            [ \"$p\" = \"$PPID\" ] && continue; \
            [ \"$(cut -d' ' -f4 $d/stat 2>/dev/null)\" = \"$guest\" ] || continue; \
            kill -STOP $p 2>/dev/null || continue; \
            case \"$seen\" in *\" $p \"*) ;; *) seen=\"$seen$p \";; esac; done; done; echo $seen";
        // Meanwhile, several commands at once, each carrying 300 KiB of
        // arguments (more than a supervisor's socket takes unread).
        let big = "x".repeat(100 << 10);
        let script = "echo $PPID; sleep 0.5";
        let both = || -> Res<(Output, Vec<Output>)> {
            std::thread::scope(|scope| {
                let attacker = scope.spawn(|| sh(h, attack));
                std::thread::sleep(Duration::from_millis(300));
                let runs: Vec<_> = (0..4)
                    .map(|_| {
                        scope.spawn(|| {
                            let argv = ["sh", "-c", script, "sh", &big, &big, &big];
                            // Not `run`: its message would quote 300 KiB.
                            h.sandbox()
                                .exec(&Command::new(argv))
                                .ctx("a command with 300 KiB of arguments while supervisors are stopped")
                        })
                    })
                    .collect();
                let outs = runs
                    .into_iter()
                    .map(|r| r.join().unwrap_or_else(|_| Err(Outcome::Failed("exec panicked".into()))))
                    .collect::<Res<Vec<Output>>>()?;
                let attack = attacker
                    .join()
                    .unwrap_or_else(|_| Err(Outcome::Failed("exec panicked".into())))?;
                Ok((attack, outs))
            })
        };
        let (attacked, outs) = within(HANG_GUARD, "commands while supervisors are stopped", both, || {
            let _ = h.sandbox().close();
        })??;
        let stopped: Vec<String> = String::from_utf8_lossy(&attacked.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let mut parents = Vec::new();
        for out in &outs {
            ensure!(
                out.status == ExitStatus::Code(0),
                "a command while supervisors were stopped: {:?} stderr {}",
                out.status,
                show(&out.stderr)
            );
            parents.push(String::from_utf8_lossy(&out.stdout).trim().to_string());
        }
        // Where each supervisor is a Landlock domain of its own with
        // signals scoped (a backend sharing the host's processes, ABI 6),
        // no command can stop another's supervisor: the attack fails
        // outright, which is the better answer.
        let caps = h.sandbox().capabilities();
        let scoped = caps.shared.contains(&hako_core::Shared::Processes)
            && caps.landlock_abi.is_some_and(|abi| abi >= 6);
        if scoped && stopped.is_empty() {
            return still_works(h, "supervisors were attacked");
        }
        ensure!(
            parents.iter().any(|p| stopped.contains(p)),
            "no command ran on a supervisor the attack stopped (stopped {stopped:?}, used {parents:?}), so the check proves nothing; attack stderr {}",
            show(&attacked.stderr)
        );
        still_works(h, "supervisors were stopped")
    }
}
