//! Removing what dead hako processes left behind: containers and
//! copy-on-write volumes labelled with an owner that no longer runs (see
//! `hako_container::Owner`), and seccomp profiles named after one.

use hako_container::runner::Runner;
use hako_container::{Engine, Owner, LABEL_PID, LABEL_START};
use hako_core::{Error, Result};

fn failed(op: &'static str, message: String) -> Error {
    Error::Backend {
        backend: "docker".into(),
        op,
        message,
    }
}

/// The containers (running or not) whose owning hako process is gone.
pub fn stale_containers(engine: &Engine, runner: &dyn Runner) -> Result<Vec<String>> {
    let ls = ["ps", "--all"];
    stale(
        engine,
        runner,
        "list containers",
        &ls,
        "{{.Names}}",
        &["inspect"],
        ".Config.Labels",
    )
}

/// What `ls` (with hako's owner filter, printing `name_format`) lists
/// whose owning hako process is gone, as `inspect` prints their owner
/// labels (at `labels` in its template); `op` names the listing in an
/// error.
fn stale(
    engine: &Engine,
    runner: &dyn Runner,
    op: &'static str,
    ls: &[&str],
    name_format: &str,
    inspect: &[&str],
    labels: &str,
) -> Result<Vec<String>> {
    let io = |e: std::io::Error| failed(op, e.to_string());
    let mut list = engine.command(ls.iter().copied());
    list.extend([
        "--filter".to_string(),
        format!("label={LABEL_PID}"),
        "--format".into(),
        name_format.into(),
    ]);
    let out = runner.output(&list).map_err(io)?;
    if !out.success {
        return Err(failed(op, out.message()));
    }
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    if names.is_empty() {
        return Ok(names);
    }
    let mut inspect = engine.command(inspect.iter().copied());
    inspect.extend([
        "--format".to_string(),
        format!(
            "{{{{.Name}}}} {{{{index {labels} \"{LABEL_PID}\"}}}} {{{{index {labels} \"{LABEL_START}\"}}}}"
        ),
    ]);
    inspect.extend(names.iter().cloned());
    let out = runner.output(&inspect).map_err(io)?;
    // One removed between the two calls makes inspect fail for it alone;
    // the others are still printed.
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(parse_owner_line)
        .filter(|(_, owner)| !owner.alive())
        .map(|(name, _)| name)
        .collect())
}

/// `NAME PID START` as inspect prints it (Docker puts a `/` before names).
fn parse_owner_line(line: &str) -> Option<(String, Owner)> {
    let mut words = line.split_whitespace();
    let name = words.next()?.trim_start_matches('/').to_string();
    let pid = words.next()?.parse().ok()?;
    let start = words.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    Some((name, Owner { pid, start }))
}

/// Removes every stale container; returns their names.
pub fn collect(engine: &Engine, runner: &dyn Runner) -> Result<Vec<String>> {
    let stale = stale_containers(engine, runner)?;
    if !stale.is_empty() {
        let mut rm = engine.command(["rm", "--force"]);
        rm.extend(stale.iter().cloned());
        let out = runner
            .output(&rm)
            .map_err(|e| failed("remove stale containers", e.to_string()))?;
        if !out.success {
            return Err(failed("remove stale containers", out.message()));
        }
    }
    Ok(stale)
}

/// The copy-on-write volumes (see `crate::cow`) whose owning hako
/// process is gone.
pub fn stale_volumes(engine: &Engine, runner: &dyn Runner) -> Result<Vec<String>> {
    let ls = ["volume", "ls"];
    stale(
        engine,
        runner,
        "list volumes",
        &ls,
        "{{.Name}}",
        &["volume", "inspect"],
        ".Labels",
    )
}

/// Removes every stale copy-on-write volume (after the stale containers,
/// which may hold one: see [`collect`]); returns those removed. One still
/// in use (its container going) is left for the next collection.
pub fn collect_volumes(engine: &Engine, runner: &dyn Runner) -> Result<Vec<String>> {
    let mut removed = Vec::new();
    for name in stale_volumes(engine, runner)? {
        let out = runner
            .output(&engine.command(["volume", "rm", name.as_str()]))
            .map_err(|e| failed("remove stale volumes", e.to_string()))?;
        if out.success {
            removed.push(name);
        } else {
            tracing::debug!("docker: removing stale volume {name}: {}", out.message());
        }
    }
    Ok(removed)
}

/// How the seccomp profiles hako writes for the runtime are named in its
/// private directory: `hako-seccomp-PID-START-XXXXXX.json`, after the
/// process that wrote it (its pid and start time).
pub const PROFILE_PREFIX: &str = "hako-seccomp-";

/// The owner a profile's file name gives, if it is one of hako's.
fn profile_owner(name: &str) -> Option<Owner> {
    let rest = name.strip_prefix(PROFILE_PREFIX)?.strip_suffix(".json")?;
    let mut parts = rest.splitn(3, '-');
    let pid = parts.next()?.parse().ok()?;
    let start = parts.next()?.parse().ok()?;
    parts.next()?;
    Some(Owner { pid, start })
}

/// Removes from hako's private directory the seccomp profiles whose
/// writer no longer runs (a hako killed outright never removed its own);
/// returns what it removed. A plain file of this user's only (the
/// directory is this user's, mode 0700; a symlink or anything else is
/// left alone). A profile of a live process is in use and kept.
pub fn collect_profiles() -> Vec<std::path::PathBuf> {
    let Ok(dir) = hako_container::private::private_dir() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let me = hako_sys::rustix::process::geteuid().as_raw();
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(profile_owner) else {
            continue;
        };
        let plain = entry.metadata().is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.file_type().is_file() && m.uid() == me
        });
        if plain && !owner.alive() && std::fs::remove_file(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use hako_container::runner::{Recorder, RunOutput};
    use hako_container::EngineKind;

    #[test]
    fn a_profile_names_its_owner_and_nothing_else_is_taken_for_one() {
        let owner = profile_owner("hako-seccomp-123-456-AbC9xz.json").unwrap();
        assert_eq!((owner.pid, owner.start), (123, 456));
        for other in [
            "hako-seccomp-AbC9xz.json",
            "hako-seccomp-123-AbC9xz.json",
            "hako-seccomp-123-456-AbC9xz",
            "hako-gvisor-123-456",
            "other-123-456-x.json",
        ] {
            assert!(profile_owner(other).is_none(), "{other}");
        }
    }

    #[test]
    fn only_volumes_of_dead_owners_are_removed() {
        let me = Owner::current();
        let answer = |stdout: String| RunOutput {
            success: true,
            stdout: stdout.into_bytes(),
            stderr: Vec::new(),
        };
        let recorder = Recorder {
            script: vec![
                (
                    vec!["volume".into(), "ls".into()],
                    answer("hako-a\nhako-b\n".into()),
                ),
                (
                    vec!["volume".into(), "inspect".into()],
                    answer(format!(
                        "hako-a {} {}\nhako-b {} 5\n",
                        me.pid,
                        me.start,
                        u32::MAX - 1
                    )),
                ),
            ],
            ..Recorder::default()
        };
        let engine = Engine {
            argv: vec!["podman".into()],
            kind: EngineKind::Podman,
        };
        let removed = collect_volumes(&engine, &recorder).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(removed, ["hako-b"]);
        let calls = recorder.calls();
        assert_eq!(
            calls[0],
            [
                "podman",
                "volume",
                "ls",
                "--filter",
                "label=hako.owner.pid",
                "--format",
                "{{.Name}}"
            ]
        );
        assert_eq!(calls.last().unwrap(), &["podman", "volume", "rm", "hako-b"]);
        assert_eq!(calls.len(), 3);
    }

    #[test]
    fn only_containers_of_dead_owners_are_removed() {
        let me = Owner::current();
        let recorder = Recorder {
            script: vec![
                (
                    vec!["ps".into()],
                    RunOutput {
                        success: true,
                        stdout: b"hako-a\nhako-b\nhako-c\n".to_vec(),
                        stderr: Vec::new(),
                    },
                ),
                (
                    vec!["inspect".into()],
                    RunOutput {
                        success: true,
                        stdout: format!(
                            "/hako-a {} {}\n/hako-b {} {}\n/hako-c {} 5\n",
                            me.pid,
                            me.start,
                            me.pid,
                            me.start + 1,
                            u32::MAX - 1
                        )
                        .into_bytes(),
                        stderr: Vec::new(),
                    },
                ),
            ],
            ..Recorder::default()
        };
        let engine = Engine {
            argv: vec!["docker".into()],
            kind: EngineKind::Docker,
        };
        let removed = collect(&engine, &recorder).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(removed, ["hako-b", "hako-c"]);
        let calls = recorder.calls();
        assert_eq!(calls.len(), 3);
        assert_eq!(
            calls[0],
            [
                "docker",
                "ps",
                "--all",
                "--filter",
                "label=hako.owner.pid",
                "--format",
                "{{.Names}}"
            ]
        );
        assert_eq!(calls[2], ["docker", "rm", "--force", "hako-b", "hako-c"]);
    }
}
