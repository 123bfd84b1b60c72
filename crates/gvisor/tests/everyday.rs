#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! Whether this host's `runsc` runs everyday tools (`hako_gvisor::everyday`),
//! checked against the real `runsc`: the verdict its version gives is the
//! one a probe run in it gives, and `ls -la` and `stat` work in a gvisor
//! sandbox exactly when it says so. Needs runsc and a static guest built
//! from this tree in `HAKO_GUEST_STATIC`; without them every case skips,
//! unless `HAKO_MUST_WORK=1`.

use std::path::PathBuf;

use hako_core::{Command, Sandbox};
use hako_gvisor::everyday::{
    everyday_tools_work_with, probe_stat, release_date, verdict_by_date, verdict_by_probe,
    CACHE_FILE,
};
use hako_gvisor::{everyday_tools_work, ready, runsc_path, GvisorConfig, GvisorSandbox};

/// `runsc` and the static guest, or `None` (printed) where there are none.
fn runsc_and_guest() -> Option<(PathBuf, PathBuf)> {
    if let Err(reason) = ready() {
        assert!(!hako_conformance::must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return None;
    }
    let guest = hako_container::locate_static_guest("gvisor", None).unwrap();
    Some((runsc_path(None), guest))
}

fn version(runsc: &std::path::Path) -> String {
    let out = std::process::Command::new(runsc)
        .arg("--version")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn the_verdict_of_runsc_s_release_date_is_the_one_a_probe_run_in_it_gives() {
    let Some((runsc, guest)) = runsc_and_guest() else {
        return;
    };
    let scratch = tempfile::tempdir().unwrap();
    let probe = probe_stat(&runsc, &guest, scratch.path()).unwrap();
    let version = version(&runsc);
    eprintln!("{version}: {probe:?}");
    let by_probe = verdict_by_probe(&runsc, &version, probe);
    if let Some(date) = release_date(&version) {
        let by_date = verdict_by_date(&runsc, &version, date);
        assert_eq!(
            by_date.is_ok(),
            by_probe.is_ok(),
            "{by_date:?} {by_probe:?}"
        );
    }
    // What the whole check answers, worked out once, then kept.
    let dir = tempfile::tempdir().unwrap();
    let first = everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path()));
    assert_eq!(first.is_ok(), by_probe.is_ok(), "{first:?} {by_probe:?}");
    assert!(dir.path().join(CACHE_FILE).is_file());
    let second = everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path()));
    assert_eq!(first, second);
    if let Err(reason) = &first {
        assert!(
            reason.contains(&version) && reason.contains("ls -la"),
            "{reason}"
        );
    }
}

#[test]
fn a_runsc_whose_version_names_no_date_is_judged_by_a_probe_run_in_it() {
    use std::os::unix::fs::PermissionsExt;
    let Some((runsc, guest)) = runsc_and_guest() else {
        return;
    };
    // The real runsc, but for a version with no release date in it.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = dir.path().join("runsc");
    let real = which(&runsc);
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && echo 'runsc version VERSION_MISSING' && exit 0\nexec '{}' \"$@\"\n",
            real.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let probe = probe_stat(&runsc, &guest, scratch.path()).unwrap();
    let expected = verdict_by_probe(&wrapper, "runsc version VERSION_MISSING", probe);
    let verdict = everyday_tools_work_with(&wrapper, Some(&guest), Some(dir.path()));
    assert_eq!(verdict, expected);
    // Kept for this guest only.
    let kept = std::fs::read_to_string(dir.path().join(CACHE_FILE)).unwrap();
    assert!(
        kept.lines()
            .nth(2)
            .unwrap()
            .contains(guest.to_str().unwrap()),
        "{kept}"
    );
    assert_eq!(
        everyday_tools_work_with(&wrapper, Some(&guest), Some(dir.path())),
        expected
    );
}

/// `runsc` as a path.
fn which(runsc: &std::path::Path) -> PathBuf {
    if runsc.components().count() > 1 {
        return runsc.to_path_buf();
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap())
        .map(|d| d.join(runsc))
        .find(|p| p.is_file())
        .unwrap()
}

#[test]
fn ls_la_and_stat_work_in_a_gvisor_sandbox_exactly_when_runsc_is_judged_fit() {
    let Some(_) = runsc_and_guest() else {
        return;
    };
    let verdict = everyday_tools_work();
    eprintln!("verdict: {verdict:?}");
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    std::fs::write(ws.join("f"), "x").unwrap();
    let sandbox = GvisorSandbox::new(GvisorConfig::new(&ws)).unwrap();
    let out = sandbox.exec(&Command::shell("ls -la . && stat f")).unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.success(), verdict.is_ok(), "{verdict:?}: {text}");
    if verdict.is_err() {
        assert!(text.contains("Invalid argument"), "{text}");
    }
    // The sandbox still serves after the tools failed.
    let out = sandbox.exec(&Command::shell("echo still")).unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "still\n");
    sandbox.close().unwrap();
}

/// `runsc` hands the files of a sandbox's standard streams to the
/// sandbox's user by changing their owner: given `/dev/null`, probing it
/// (what `hako doctor` and `--backend auto` do) handed the host's own
/// `/dev/null` to `nobody`. The probe gives it files of its own; the
/// host's `/dev/null` keeps its owner and mode, and the probe still
/// answers.
#[test]
fn probing_runsc_leaves_the_host_s_dev_null_owner_and_mode_as_they_were() {
    use std::os::unix::fs::MetadataExt;
    let Some((runsc, guest)) = runsc_and_guest() else {
        return;
    };
    let before = std::fs::metadata("/dev/null").unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let probe = probe_stat(&runsc, &guest, scratch.path());
    let after = std::fs::metadata("/dev/null").unwrap();
    assert_eq!(
        (after.uid(), after.gid(), after.mode()),
        (before.uid(), before.gid(), before.mode()),
        "the host's /dev/null changed"
    );
    assert!(probe.is_ok(), "{probe:?}");
}
