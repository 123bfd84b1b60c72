//! The sandbox as a whole: closing it, and what it says it enforces.

use std::path::Path;

use hako_core::{Command, Error};

use crate::check::{Ctx, Res};
use crate::harness::diff;

fn closed<T: std::fmt::Debug>(result: Option<Result<T, Error>>, what: &str) -> Res {
    match result {
        None | Some(Err(Error::Closed)) => Ok(()),
        Some(other) => fail!("{what} after close(): got {other:?}, expected Closed"),
    }
}

case! {
    /// After `close()`, exec and every file operation return `Closed` and
    /// change nothing; `close()` again is fine.
    fn closed_sandbox_refuses_every_operation(h) {
        h.plant_file("f", b"kept")?;
        h.plant_dir("d")?;
        let before = h.snapshot_workspace().ctx("snapshot")?;
        let sb = h.sandbox();
        sb.close().ctx("close")?;
        let p = Path::new;
        closed(Some(sb.exec(&Command::new(["touch", "made"]))), "exec")?;
        closed(Some(sb.read_file(p("f"))), "read_file")?;
        closed(Some(sb.write_file(p("f"), b"changed")), "write_file")?;
        closed(Some(sb.write_file(p("new"), b"new")), "write_file of a new file")?;
        closed(Some(sb.remove(p("f"))), "remove")?;
        closed(Some(sb.list_dir(p("."))), "list_dir")?;
        closed(sb.read_limit().map(|l| l.read_file_limit(p("f"), 10)), "read_file_limit")?;
        closed(sb.append().map(|a| a.append_file(p("f"), b"+")), "append_file")?;
        closed(sb.make_dir_all().map(|m| m.make_dir_all(p("d/e"))), "make_dir_all")?;
        closed(sb.stat().map(|s| s.stat(p("f"))), "stat")?;
        closed(
            sb.exec_stream().map(|s| s.exec_stream(&Command::new(["true"]), &mut |_, _| {})),
            "exec_stream",
        )?;
        closed(
            sb.sessions().map(|s| s.open_session(&hako_core::SessionOptions::default())),
            "open_session",
        )?;
        closed(
            sb.processes().map(|p| p.spawn(&Command::new(["true"]), &hako_core::SpawnOptions::default())),
            "spawn",
        )?;
        closed(sb.processes().map(|p| p.list()), "list processes")?;
        sb.close().ctx("close a second time")?;
        sb.close().ctx("close a third time")?;
        let _ = sb.capabilities();
        let after = h.snapshot_workspace().ctx("snapshot")?;
        if let Some(d) = diff(&before, &after) {
            fail!("a closed sandbox changed the workspace: {d}");
        }
        Ok(())
    }
}

case! {
    /// `capabilities()` is stable and its optional flags match the accessors
    /// exactly (a flag without the trait, or the trait without the flag, is
    /// a lie); each limit is reported once. The isolation level is printed.
    fn capabilities_match_the_optional_accessors(h) {
        let sb = h.sandbox();
        let caps = sb.capabilities().clone();
        eprintln!(
            "{}: backend {:?}, isolation {}, network {:?}, fence {:?}, env_sanitised {}, fds_closed {}, landlock {:?}, seccomp {}, limits {:?}, optional {:?}",
            h.case(),
            caps.backend,
            caps.isolation,
            caps.network,
            caps.fence,
            caps.env_sanitised,
            caps.fds_closed,
            caps.landlock_abi,
            caps.seccomp,
            caps.limits,
            caps.optional
        );
        ensure!(!caps.backend.is_empty(), "the backend has no name");
        ensure_eq!(sb.capabilities(), &caps, "capabilities() a second time");
        let o = caps.optional;
        for (name, flag, offered) in [
            ("read_limit", o.read_limit, sb.read_limit().is_some()),
            ("append", o.append, sb.append().is_some()),
            ("make_dir_all", o.make_dir_all, sb.make_dir_all().is_some()),
            ("workdir", o.workdir, sb.workdir().is_some()),
            ("stat", o.stat, sb.stat().is_some()),
            ("exec_stream", o.exec_stream, sb.exec_stream().is_some()),
            ("sessions", o.sessions, sb.sessions().is_some()),
            ("processes", o.processes, sb.processes().is_some()),
        ] {
            ensure_eq!(flag, offered, "optional.{name} flag vs the {name}() accessor");
        }
        if let Some(w) = sb.workdir() {
            ensure!(w.workdir().is_absolute(), "workdir {:?} is not absolute", w.workdir());
        }
        let mut kinds: Vec<_> = caps.limits.iter().map(|l| format!("{:?}", l.kind)).collect();
        kinds.sort();
        let count = kinds.len();
        kinds.dedup();
        ensure_eq!(kinds.len(), count, "limits reported more than once: {:?}", caps.limits);
        Ok(())
    }
}
