#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The gvisor backend when things go wrong, against the real `runsc`:
//! nothing is left behind. Skips (unless `HAKO_MUST_WORK=1`) without
//! `runsc` or a static guest.

use hako_core::{Command, Sandbox};
use hako_gvisor::{GvisorConfig, GvisorSandbox};

/// The tests of this file one at a time: the first counts the bundles
/// this process has, which the others' sandboxes would change.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    (dir, ws)
}

#[test]
fn a_gvisor_sandbox_leaves_no_bundle_or_container_when_closed() {
    let _one = one_at_a_time();
    if let Err(reason) = hako_gvisor::ready() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (_d, ws) = workspace();
    let bundles = || {
        std::fs::read_dir(hako_container::private::private_dir().unwrap())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("hako-gvisor-{}-", std::process::id()))
            })
            .count()
    };
    let before = bundles();
    let sandbox = GvisorSandbox::new(GvisorConfig::new(&ws)).unwrap();
    assert_eq!(bundles(), before + 1);
    // What `hako gc` would act on once its owners are gone: the user's own
    // directories, with no access for group or others.
    let private = hako_container::private::private_dir().unwrap();
    let bundle = std::fs::read_dir(&private)
        .unwrap()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("hako-gvisor-{}-", std::process::id()))
        })
        .unwrap()
        .path();
    for dir in [bundle.clone(), bundle.join("state")] {
        let unfit = hako_container::private::check_dir(&dir).unwrap();
        assert_eq!(unfit, None, "{}", dir.display());
    }
    let out = sandbox.exec(&Command::new(["true"])).unwrap();
    assert!(out.status.success());
    sandbox.close().unwrap();
    assert_eq!(bundles(), before, "the bundle is removed at close");
}

/// The parent of host process `pid`.
fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// The host processes named `argv0` of container `id`: its
/// `runsc-sandbox` names it; the gofer is that process's sibling.
fn runsc_processes(argv0: &str, id: &str) -> Vec<i32> {
    let sandboxes = hako_conformance::lost::host_processes_named("runsc-sandbox", id);
    if argv0 == "runsc-sandbox" {
        return sandboxes;
    }
    let parents: Vec<_> = sandboxes.iter().filter_map(|p| parent(*p)).collect();
    hako_conformance::lost::host_processes_named(argv0, "")
        .into_iter()
        .filter(|p| parent(*p).is_some_and(|pp| parents.contains(&pp)))
        .collect()
}

/// Kills (SIGKILL) every host process named `argv0` of container `id`,
/// once there is one.
fn kill_runsc_process(argv0: &str, id: &str) -> Result<(), String> {
    let start = std::time::Instant::now();
    loop {
        let pids = runsc_processes(argv0, id);
        if !pids.is_empty() {
            for pid in pids {
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid.to_string()])
                    .status();
            }
            return Ok(());
        }
        if start.elapsed() > std::time::Duration::from_secs(30) {
            return Err(format!("no {argv0} process of {id} on the host"));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The sandbox lost to `argv0` killed: every call fails with
/// `SandboxLost` (see `hako_conformance::lost`), and neither a runsc
/// process of it nor its bundle is left.
fn lost_when_killed(argv0: &str) {
    let _one = one_at_a_time();
    if let Err(reason) = hako_gvisor::ready() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (_d, ws) = workspace();
    let sandbox = GvisorSandbox::new(GvisorConfig::new(&ws)).unwrap();
    let id = sandbox.container().to_string();
    let lost = hako_conformance::lost::lost_mid_command_session_and_process(&sandbox, |_| {
        kill_runsc_process(argv0, &id)
    })
    .unwrap();
    let said = lost.later.to_string();
    assert!(said.contains("guest ended"), "{said}");
    assert!(
        runsc_processes("runsc-sandbox", &id).is_empty(),
        "a runsc process of {id} is left"
    );
    let private = hako_container::private::private_dir().unwrap();
    let left: Vec<_> = std::fs::read_dir(&private)
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("config.json")).is_ok_and(|c| c.contains(&id))
        })
        .collect();
    assert!(left.is_empty(), "its bundle is left: {left:?}");
}

#[test]
fn runscs_sandbox_process_killed_mid_command_session_and_process_is_reported_lost() {
    lost_when_killed("runsc-sandbox");
}

#[test]
fn runscs_gofer_killed_mid_command_session_and_process_is_reported_lost() {
    lost_when_killed("runsc-gofer");
}

/// Whether any host process's mount table mentions `path` (the overlay
/// a copy-on-write sandbox's host view mounts over the workspace, or
/// runsc's bind of it).
fn mounted_anywhere(path: &std::path::Path) -> Vec<String> {
    let needle = format!(" {} ", path.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read_to_string(e.path().join("mountinfo")).ok())
        .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
        .filter(|l| l.contains(&needle))
        .collect()
}

/// A copy-on-write sandbox closed, and one lost to its `runsc-sandbox`
/// killed: neither leaves its overlay mounted nor a runsc
/// process running, the real workspace is never written, and the layers
/// are free for the next sandbox, which continues on them.
#[test]
fn a_cow_gvisor_sandbox_leaves_nothing_mounted_or_running_when_closed_or_lost() {
    let _one = one_at_a_time();
    if let Err(reason) = hako_gvisor::ready() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    let (_d, ws) = workspace();
    std::fs::write(ws.join("a"), "a\n").unwrap();
    let state_dir = tempfile::tempdir().unwrap();
    let state =
        hako_layers::state::State::create(&state_dir.path().join("hako"), "n", &ws, &[]).unwrap();
    let open = || {
        let mut config = GvisorConfig::new(&ws);
        config.spec.cow = Some(hako_core::CowLayers {
            upper: state.upper(),
            work: state.work(),
        });
        GvisorSandbox::new(config).unwrap()
    };
    for lose in [false, true] {
        let sandbox = open();
        let id = sandbox.container().to_string();
        let out = sandbox.exec(&Command::shell("echo x >> a")).unwrap();
        assert!(out.status.success());
        // The overlay is there while the sandbox is (in runsc's namespace).
        let open_mounts = mounted_anywhere(&ws);
        assert!(
            open_mounts.iter().any(|l| l.contains(" - overlay ")),
            "{open_mounts:?}"
        );
        if lose {
            kill_runsc_process("runsc-sandbox", &id).unwrap();
            let err = sandbox.exec(&Command::shell("true")).unwrap_err();
            assert!(err.to_string().contains("guest ended"), "{err}");
        }
        sandbox.close().unwrap();
        assert!(
            runsc_processes("runsc-sandbox", &id).is_empty(),
            "a runsc process of {id} is left"
        );
        assert_eq!(mounted_anywhere(&ws), Vec::<String>::new(), "lose: {lose}");
        drop(sandbox);
        assert_eq!(std::fs::read_to_string(ws.join("a")).unwrap(), "a\n");
    }
    // Contained: the next sandbox continues on the layers both left.
    let sandbox = open();
    let out = sandbox.exec(&Command::shell("cat a")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a\nx\nx\n");
    sandbox.close().unwrap();
}
