//! Host-backend behaviour the conformance factory (which takes only a
//! workspace) cannot express: configured limits, the environment policy,
//! the isolation gate, the fence resolver, the guest's location.

use std::path::{Path, PathBuf};
use std::time::Duration;

use hako_core::env::EnvPolicy;
use hako_core::{
    require_isolation, Command, Error, ExitStatus, FenceError, FenceResolver, Isolation, LimitKind,
    Sandbox, DEFAULT_MAX_OUTPUT,
};
use hako_fence::FenceOptions;
use hako_host::{HostConfig, HostSandbox};

fn workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    (dir, ws)
}

fn printed(sb: &HostSandbox, name: &str) -> String {
    let out = sb
        .exec(&Command::shell(format!(
            "printf %s \"${{{name}-<unset>}}\""
        )))
        .unwrap();
    assert_eq!(out.status, ExitStatus::Code(0), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn whole_file_read_over_the_limit_is_file_too_large() {
    let (_dir, ws) = workspace();
    let mut config = HostConfig::new(&ws);
    config.launch.fence = FenceOptions {
        max_read: 10,
        ..FenceOptions::default()
    };
    let sb = HostSandbox::new(config).unwrap();
    std::fs::write(ws.join("ten"), b"0123456789").unwrap();
    std::fs::write(ws.join("eleven"), b"0123456789X").unwrap();
    assert_eq!(sb.read_file(Path::new("ten")).unwrap(), b"0123456789");
    match sb.read_file(Path::new("eleven")) {
        Err(Error::Fence(FenceError::FileTooLarge { size, max, path })) => {
            assert_eq!((size, max), (11, 10));
            assert_eq!(path, Path::new("eleven"));
        }
        other => panic!("expected FileTooLarge, got {other:?}"),
    }
    // A bounded read is not subject to the whole-file limit.
    let limited = sb.read_limit().unwrap();
    let got = limited.read_file_limit(Path::new("eleven"), 100).unwrap();
    assert_eq!(
        (got.data.as_slice(), got.truncated),
        (&b"0123456789X"[..], false)
    );
    let limit = sb
        .capabilities()
        .limits
        .iter()
        .find(|l| l.kind == LimitKind::ReadBytes)
        .unwrap();
    assert_eq!(limit.value, Some(10));
}

#[test]
fn default_max_output_is_one_mebibyte() {
    let (_dir, ws) = workspace();
    let sb = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    assert_eq!(DEFAULT_MAX_OUTPUT, 1 << 20);
    let out = sb
        .exec(&Command::new(["head", "-c", "3000000", "/dev/zero"]))
        .unwrap();
    assert_eq!(out.status, ExitStatus::Code(0));
    assert_eq!(out.stdout.len(), 1 << 20);
    assert!(out.stdout_truncated);
    assert_eq!(out.stdout_total, 3_000_000);
    let limit = sb
        .capabilities()
        .limits
        .iter()
        .find(|l| l.kind == LimitKind::OutputBytes)
        .unwrap();
    assert_eq!(limit.value, Some(1 << 20));
}

#[test]
fn configured_max_output_applies_when_the_command_sets_none() {
    let (_dir, ws) = workspace();
    let mut config = HostConfig::new(&ws);
    config.spec.max_output = 100;
    let sb = HostSandbox::new(config).unwrap();
    let out = sb
        .exec(&Command::new(["head", "-c", "1000", "/dev/zero"]))
        .unwrap();
    assert_eq!(
        (out.stdout.len(), out.stdout_truncated, out.stdout_total),
        (100, true, 1000)
    );
    // The command's own cap wins.
    let out = sb
        .exec(&Command::new(["head", "-c", "1000", "/dev/zero"]).max_output(500))
        .unwrap();
    assert_eq!((out.stdout.len(), out.stdout_truncated), (500, true));
}

#[test]
fn a_secret_named_one_by_one_passes_and_a_wildcard_does_not_pass_it() {
    std::env::set_var("HAKO_HOST_TEST_NAMED_TOKEN", "named-one");
    std::env::set_var("HAKO_HOST_TEST_WILD_TOKEN", "wild-one");
    std::env::set_var("HAKO_HOST_TEST_PLAIN", "plain-one");
    let (_dir, ws) = workspace();
    let mut config = HostConfig::new(&ws);
    config.spec.env = EnvPolicy {
        pass: vec![
            "HAKO_HOST_TEST_NAMED_TOKEN".into(),
            "HAKO_HOST_TEST_*".into(),
        ],
        set: vec![("HAKO_HOST_TEST_SET".into(), "set-one".into())],
    };
    let sb = HostSandbox::new(config).unwrap();
    assert_eq!(printed(&sb, "HAKO_HOST_TEST_NAMED_TOKEN"), "named-one");
    assert_eq!(printed(&sb, "HAKO_HOST_TEST_WILD_TOKEN"), "<unset>");
    assert_eq!(printed(&sb, "HAKO_HOST_TEST_PLAIN"), "plain-one");
    assert_eq!(printed(&sb, "HAKO_HOST_TEST_SET"), "set-one");
    let names: Vec<&str> = sb.base_env().iter().map(|(k, _)| k.as_str()).collect();
    assert!(names.contains(&"HAKO_HOST_TEST_NAMED_TOKEN"), "{names:?}");
    assert!(!names.contains(&"HAKO_HOST_TEST_WILD_TOKEN"), "{names:?}");

    // The default policy passes none of them.
    let default = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    for name in [
        "HAKO_HOST_TEST_NAMED_TOKEN",
        "HAKO_HOST_TEST_WILD_TOKEN",
        "HAKO_HOST_TEST_PLAIN",
    ] {
        assert_eq!(printed(&default, name), "<unset>", "{name}");
    }
}

#[test]
fn min_isolation_gate_names_both_levels() {
    let (_dir, ws) = workspace();
    let sb = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    assert_eq!(sb.capabilities().isolation, Isolation::None);
    require_isolation(&sb, Isolation::None).unwrap();
    for required in [Isolation::Process, Isolation::Kernel, Isolation::Vm] {
        match require_isolation(&sb, required) {
            Err(err @ Error::IsolationTooWeak { .. }) => {
                let message = err.to_string();
                assert!(message.contains(&format!("`{required}`")), "{message}");
                assert!(message.contains("`none`"), "{message}");
                assert!(message.contains("host"), "{message}");
            }
            other => panic!("{required}: expected IsolationTooWeak, got {other:?}"),
        }
    }
    let message = require_isolation(&sb, Isolation::Vm)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("vm") && message.contains("none"),
        "{message}"
    );
}

#[test]
fn capabilities_report_the_resolver_in_force() {
    let (_dir, ws) = workspace();
    let mut config = HostConfig::new(&ws);
    config.launch.fence.resolver = Some(FenceResolver::ComponentWalk);
    let walk = HostSandbox::new(config).unwrap();
    assert_eq!(walk.capabilities().fence, FenceResolver::ComponentWalk);
    let default = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    let expected = if hako_fence::resolver_available(FenceResolver::Openat2) {
        FenceResolver::Openat2
    } else {
        FenceResolver::ComponentWalk
    };
    assert_eq!(default.capabilities().fence, expected);
    let caps = default.capabilities();
    assert!(caps.env_sanitised && caps.fds_closed && !caps.seccomp);
    assert_eq!(caps.landlock_abi, None);
}

#[test]
fn workdir_is_the_canonical_workspace_and_its_alias_is_accepted() {
    let (_dir, root) = workspace();
    let real = root.join("real");
    std::fs::create_dir(&real).unwrap();
    let alias = root.join("alias");
    std::os::unix::fs::symlink(&real, &alias).unwrap();
    let sb = HostSandbox::new(HostConfig::new(&alias)).unwrap();
    assert_eq!(sb.workdir().unwrap().workdir(), real);
    // Absolute paths through the canonical path and through the alias both
    // name the workspace.
    sb.write_file(&real.join("a"), b"via real").unwrap();
    assert_eq!(sb.read_file(&alias.join("a")).unwrap(), b"via real");
    let out = sb.exec(&Command::new(["pwd", "-P"])).unwrap();
    assert_eq!(out.stdout, format!("{}\n", real.display()).into_bytes());
    // The directory above is still outside.
    assert!(matches!(
        sb.read_file(&root.join("real/../alias/a"))
            .unwrap_err()
            .as_fence(),
        Some(FenceError::DotDotEscape { .. })
    ));
}

#[test]
fn a_missing_guest_is_a_backend_error_with_a_hint() {
    let (_dir, ws) = workspace();
    let mut config = HostConfig::new(&ws);
    config.launch.guest = Some(ws.join("no-such-guest"));
    // The guest starts with the sandbox, so opening it fails, with the fix.
    match HostSandbox::new(config) {
        Err(err @ Error::Backend { .. }) => {
            let message = err.to_string();
            assert!(message.contains("no-such-guest"), "{message}");
            assert!(message.contains("HAKO_GUEST"), "{message}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    // Nothing was left behind in the workspace.
    assert_eq!(std::fs::read_dir(&ws).unwrap().count(), 0);
}

#[test]
fn listing_stops_at_the_entry_limit() {
    let (_dir, ws) = workspace();
    for name in ["a", "b", "c", "d", "e"] {
        std::fs::write(ws.join(name), name).unwrap();
    }
    let mut config = HostConfig::new(&ws);
    config.launch.fence.max_entries = 3;
    let sb = HostSandbox::new(config).unwrap();
    let listing = sb.list_dir(Path::new(".")).unwrap();
    assert!(listing.truncated);
    assert_eq!(listing.entries.len(), 3);
    let mut config = HostConfig::new(&ws);
    config.launch.fence.max_entries = 5;
    let listing = HostSandbox::new(config)
        .unwrap()
        .list_dir(Path::new("."))
        .unwrap();
    assert!(!listing.truncated);
    assert_eq!(listing.entries.len(), 5);
}

/// Set in a child copy of this test binary: run `sleep <marker>` in a host
/// sandbox on the workspace in `HAKO_HOST_TEST_CHILD_WS` and never return.
const CHILD_MARKER: &str = "HAKO_HOST_TEST_CHILD_MARKER";
const CHILD_WS: &str = "HAKO_HOST_TEST_CHILD_WS";

/// In a child started by [`caller_dies_mid_exec`], runs the long command;
/// returns whether this is that child.
fn run_as_child() -> bool {
    let (Ok(marker), Ok(ws)) = (std::env::var(CHILD_MARKER), std::env::var(CHILD_WS)) else {
        return false;
    };
    // This child stands for a hako process that Ctrl-C kills: when the
    // tests themselves were started in the background, SIGINT comes in
    // ignored.
    hako_sys::signal::restore_default(hako_sys::signal::signum::SIGINT).unwrap();
    let sb = HostSandbox::new(HostConfig::new(ws)).unwrap();
    let _ = sb.exec(&Command::new(["sleep", marker.as_str()]));
    true
}

fn unique_marker() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    // Nine digits, a valid and very long `sleep`.
    format!(
        "{}",
        100_000_000 + (nanos ^ std::process::id()) % 800_000_000
    )
}

/// Starts this test again in a child process (its own process group) that
/// runs `sleep <marker>` through a host sandbox, waits until the sleep runs,
/// kills the child with `kill`, and returns the processes left with the
/// marker (after killing them).
fn caller_dies_mid_exec(
    test: &str,
    kill: impl FnOnce(hako_sys::rustix::process::Pid),
) -> Vec<String> {
    use std::os::unix::process::CommandExt;
    use std::time::{Duration, Instant};

    use hako_conformance::host_processes_with_arg;
    use hako_sys::rustix::process::{kill_process, Pid, Signal};

    let (_dir, ws) = workspace();
    let marker = unique_marker();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([test, "--exact", "--include-ignored", "--nocapture"])
        .env(CHILD_MARKER, &marker)
        .env(CHILD_WS, &ws)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = Pid::from_raw(child.id() as i32).unwrap();
    let start = Instant::now();
    while host_processes_with_arg(&marker).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the child never started sleep {marker}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(pid);
    child.wait().unwrap();
    // The guest reacts to its control socket closing; give it a moment.
    let start = Instant::now();
    let mut left = host_processes_with_arg(&marker);
    while !left.is_empty() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
        left = host_processes_with_arg(&marker);
    }
    left.into_iter()
        .map(|(pid, cmdline)| {
            let _ = kill_process(Pid::from_raw(pid).unwrap(), Signal::KILL);
            format!("{pid} `{cmdline}`")
        })
        .collect()
}

#[test]
fn a_caller_killed_mid_exec_leaves_no_process_behind() {
    if run_as_child() {
        return;
    }
    let left = caller_dies_mid_exec(
        "host_specific::a_caller_killed_mid_exec_leaves_no_process_behind",
        |pid| {
            hako_sys::rustix::process::kill_process(pid, hako_sys::rustix::process::Signal::KILL)
                .unwrap()
        },
    );
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Ctrl-C sends SIGINT to the caller's whole foreground process group, which
/// includes `hako-guest` (it is started in the caller's group); the guest dies
/// of the default action without killing the command's tree (the command runs
/// in a session of its own), so the command survives.
#[test]

fn ctrl_c_on_the_callers_process_group_leaves_no_process_behind() {
    if run_as_child() {
        return;
    }
    let left = caller_dies_mid_exec(
        "host_specific::ctrl_c_on_the_callers_process_group_leaves_no_process_behind",
        |pid| {
            hako_sys::rustix::process::kill_process_group(
                pid,
                hako_sys::rustix::process::Signal::INT,
            )
            .unwrap()
        },
    );
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn is_root() -> bool {
    hako_sys::rustix::process::geteuid().is_root()
}

/// A device node is refused from its type alone, without being opened
/// (opening some devices has effects, e.g. a watchdog starts counting). On
/// a `nodev` mount an open fails with EACCES, so a fence that opened it
/// first would return an `Io` error here instead of `NotRegularFile`.
#[test]
fn a_device_node_is_refused_without_being_opened() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to mount tmpfs and mknod");
        return;
    }
    let (_dir, ws) = workspace();
    let mnt = ws.join("nodev");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "nodev", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(mounted.success());
    let planted = hako_sys::rustix::fs::mknodat(
        hako_sys::rustix::fs::CWD,
        mnt.join("null"),
        hako_sys::rustix::fs::FileType::CharacterDevice,
        hako_sys::rustix::fs::Mode::from_raw_mode(0o666),
        hako_sys::rustix::fs::makedev(1, 3),
    );
    let result = planted.map(|()| {
        HostSandbox::new(HostConfig::new(&ws))
            .unwrap()
            .read_file(Path::new("nodev/null"))
    });
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    let result = result.expect("mknod c 1 3");
    assert!(
        matches!(
            &result,
            Err(Error::Fence(FenceError::NotRegularFile {
                kind: hako_core::FileKind::CharDevice,
                ..
            }))
        ),
        "{result:?}"
    );
}

/// `write_file` replaces a file with a new one created by the writer and
/// copies all of `0o7777` onto it: a file an unprivileged user planted with
/// mode 4755 becomes, after hako (running as root) writes to it, a
/// setuid-root file with the written contents.
#[test]

fn rewriting_a_setuid_file_never_makes_a_setuid_file_owned_by_the_writer() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !is_root() {
        eprintln!("SKIPPED: needs root to chown");
        return;
    }
    let (_dir, ws) = workspace();
    let tool = ws.join("tool");
    std::fs::write(&tool, b"old").unwrap();
    std::os::unix::fs::chown(&tool, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let sb = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    sb.write_file(Path::new("tool"), b"#!/bin/sh\nid\n")
        .unwrap();
    let meta = std::fs::metadata(&tool).unwrap();
    assert!(
        !(meta.uid() == 0 && meta.mode() & 0o6000 != 0),
        "uid {} mode {:o}",
        meta.uid(),
        meta.mode() & 0o7777
    );
}

/// A symlink whose relative target climbs with `..` past the lexical
/// parent of the path used, but stays inside physically: reading follows it,
/// writing and appending refuse it as an escape (the write path joins the
/// target onto the lexical parent and checks `..` lexically).
#[test]

fn writing_through_a_symlink_that_climbs_but_stays_inside_works() {
    let (_dir, ws) = workspace();
    std::fs::create_dir_all(ws.join("a/b/c")).unwrap();
    std::fs::write(ws.join("x"), b"X").unwrap();
    std::os::unix::fs::symlink("a/b/c", ws.join("ld")).unwrap();
    std::os::unix::fs::symlink("../../../x", ws.join("a/b/c/up")).unwrap();
    let sb = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    assert_eq!(sb.read_file(Path::new("ld/up")).unwrap(), b"X");
    sb.write_file(Path::new("ld/up"), b"Y").unwrap();
    sb.append()
        .unwrap()
        .append_file(Path::new("ld/up"), b"Z")
        .unwrap();
    assert_eq!(std::fs::read(ws.join("x")).unwrap(), b"YZ");
}

/// `openat2(RESOLVE_BENEATH)` fails with EAGAIN when any rename on the
/// system races the lookup of a `..`; the fence retries 64 times and then
/// returns `Io(EAGAIN)`. Renames in an unrelated directory, outside the
/// sandbox, are enough to make a path with many `..` (or a symlink chain with
/// them) fail: anyone who can rename files can deny the fence.
#[test]

fn renames_elsewhere_do_not_make_dot_dot_paths_fail() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_dir, ws) = workspace();
    let (_other, elsewhere) = workspace();
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::write(ws.join("f"), b"F").unwrap();
    std::fs::write(elsewhere.join("a"), b"").unwrap();
    let sb = HostSandbox::new(HostConfig::new(&ws)).unwrap();
    assert_eq!(sb.capabilities().fence, FenceResolver::Openat2);
    let stop = AtomicBool::new(false);
    let failures = std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = std::fs::rename(elsewhere.join("a"), elsewhere.join("b"));
                let _ = std::fs::rename(elsewhere.join("b"), elsewhere.join("a"));
            }
        });
        // A long lookup (many `..`) is more likely to overlap a rename.
        let path = format!("{}f", "sub/../".repeat(580));
        let mut failures = Vec::new();
        for _ in 0..20_000 {
            if let Err(e) = sb.read_file(Path::new(&path)) {
                failures.push(e.to_string());
            }
        }
        stop.store(true, Ordering::Relaxed);
        failures
    });
    assert!(
        failures.is_empty(),
        "{} of 20000 reads failed, e.g. ...{:?}",
        failures.len(),
        failures.first().map(|f| &f[f.len().saturating_sub(80)..])
    );
}

#[test]
fn the_idle_lease_closes_an_idle_sandbox_and_a_running_process_keeps_it_open() {
    use hako_core::SpawnOptions;
    let (_dir, ws) = workspace();
    let mut config = HostConfig::new(&ws);
    config.launch.idle_timeout = Some(Duration::from_millis(300));
    let sb = HostSandbox::new(config).unwrap();
    // A running process is activity: the sandbox stays open past the lease.
    let p = sb.processes().unwrap();
    let id = p
        .spawn(&Command::new(["sleep", "1.2"]), &SpawnOptions::default())
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    sb.exec(&Command::new(["true"])).unwrap();
    assert_eq!(
        p.wait(id, None).unwrap().status,
        Some(hako_core::ExitStatus::Code(0))
    );
    // Then nothing runs and nobody calls: the lease ends it.
    let start = std::time::Instant::now();
    loop {
        match sb.exec(&Command::new(["true"])) {
            Err(Error::Closed) => break,
            Ok(_) => {}
            Err(other) => panic!("{other:?}"),
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the lease never closed the sandbox"
        );
        // Calls are activity too: wait out the lease between them.
        std::thread::sleep(Duration::from_millis(700));
    }
}

#[test]
fn cow_is_refused_with_a_typed_error_and_nothing_runs() {
    let (dir, ws) = workspace();
    std::fs::write(ws.join("a"), "a").unwrap();
    let mut config = HostConfig::new(&ws);
    config.spec.cow = Some(hako_core::CowLayers {
        upper: dir.path().join("upper"),
        work: dir.path().join("work"),
    });
    let err = HostSandbox::new(config).unwrap_err();
    assert!(
        matches!(err, hako_core::Error::Unsupported { ref backend, .. } if backend == "host"),
        "{err}"
    );
    assert!(err.to_string().contains("--cow"), "{err}");
    assert_eq!(std::fs::read_to_string(ws.join("a")).unwrap(), "a");
}
