//! End-to-end tests of `hako` with the container backends: docker (runc
//! and runsc) and gvisor, against the real runtimes. They need dockerd,
//! runsc, the image `hako image build` makes and a static guest in
//! `HAKO_GUEST_STATIC`; without them they skip, unless `HAKO_MUST_WORK=1`.
//! Every test name starts with `containers_` (CI runs them in a step of
//! their own, with the static guest set).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "support/tmux.rs"]
mod tmux;
use tmux::Tmux;

fn hako() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hako"))
}

fn must_work() -> bool {
    std::env::var_os("HAKO_MUST_WORK").is_some_and(|v| v == "1")
}

/// Whether `hako doctor` says `backend` works; skips (or fails under
/// `HAKO_MUST_WORK=1`) when not.
fn works(backend: &str) -> bool {
    let out = hako().args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let report = v["backends"]
        .as_array()
        .and_then(|b| b.iter().find(|r| r["backend"] == backend))
        .cloned()
        .unwrap_or_default();
    if report["works"] == true {
        return true;
    }
    assert!(!must_work(), "{backend} does not work here: {report}");
    eprintln!("SKIPPED: {backend}: {report}");
    false
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn containers_runs_report_their_backend_isolation_and_share_the_workspace() {
    if !works("docker") || !works("gvisor") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    for (args, backend, isolation) in [
        (vec!["--backend", "docker"], "docker", "process"),
        (
            vec!["--backend", "docker", "--runtime", "runsc"],
            "docker",
            "kernel",
        ),
        (vec!["--backend", "gvisor"], "gvisor", "kernel"),
    ] {
        // The policy gate judges docker under runsc as the sandbox then
        // reports itself: --min-isolation kernel lets it start.
        let out = hako()
            .arg("run")
            .args(&args)
            .args(["--min-isolation", isolation])
            .arg("--workspace")
            .arg(&ws)
            .args(["--json", "--", "sh", "-c", "echo inside > from-inside; pwd"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["backend"], backend, "{args:?}");
        assert_eq!(v["isolation"], isolation, "{args:?}");
        assert_eq!(v["stdout"].as_str().map(str::trim), ws.to_str(), "{args:?}");
        assert_eq!(
            std::fs::read_to_string(ws.join("from-inside")).unwrap(),
            "inside\n"
        );
        std::fs::remove_file(ws.join("from-inside")).unwrap();
    }
    // Under runc, docker is refused a kernel boundary before anything starts.
    let out = hako()
        .args(["run", "--backend", "docker", "--min-isolation", "kernel"])
        .arg("--workspace")
        .arg(&ws)
        .args(["--json", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["isolation"], "process", "{v}");
}

#[test]
fn containers_a_cow_run_on_docker_is_reviewed_by_hako_diff_and_applied_by_hako_commit() {
    if !works("docker") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();
    let (ws, state) = (root.join("ws"), root.join("state"));
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    std::fs::write(ws.join("gone.txt"), "bye\n").unwrap();
    let out = hako()
        .args([
            "run",
            "--backend",
            "docker",
            "--cow",
            "--name",
            "n",
            "--state",
        ])
        .arg(&state)
        .arg("--workspace")
        .arg(&ws)
        .args([
            "--",
            "sh",
            "-c",
            "echo two >> a.txt && echo new > b.txt && rm gone.txt && cat a.txt",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\ntwo\n");
    // The workspace is untouched until the commit.
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "one\n");
    assert!(!ws.join("b.txt").exists() && ws.join("gone.txt").exists());
    let out = hako()
        .args(["diff", "--state"])
        .arg(&state)
        .args(["n", "--stat"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stat = text(&out.stdout);
    for path in ["a.txt", "b.txt", "gone.txt"] {
        assert!(stat.contains(path), "{path} missing from {stat}");
    }
    let out = hako()
        .args(["commit", "--state"])
        .arg(&state)
        .arg("n")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "new\n");
    assert!(!ws.join("gone.txt").exists());
}

/// The labels of running containers whose owner is `pid`.
fn containers_of(pid: u32) -> Vec<String> {
    let out = Command::new("docker")
        .args([
            "ps",
            "--all",
            "--filter",
            &format!("label=hako.owner.pid={pid}"),
        ])
        .args(["--format", "{{.Names}}"])
        .output()
        .unwrap();
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn containers_killing_hako_with_sigkill_leaves_no_container() {
    if !works("docker") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = hako()
        .args(["run", "--backend", "docker", "--workspace"])
        .arg(dir.path())
        .args([
            "--",
            "sh",
            "-c",
            "sleep 1000 & setsid sleep 1000 & sleep 1000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let start = Instant::now();
    while containers_of(pid).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the container never showed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Give the command time to start its sleeps.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        profiles_of(pid).len(),
        1,
        "its seccomp profile, named after it"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // The client's death closes the guest's stdin: the guest kills
    // everything and exits, and the container is removed.
    let start = Instant::now();
    while !containers_of(pid).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still there: {:?}",
            containers_of(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // The seccomp profile it wrote for the runtime outlived it (nothing
    // runs in a process killed outright); `hako gc` (or the next sandbox
    // any hako opens) removes it.
    let out = hako().arg("gc").output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        profiles_of(pid),
        Vec::<String>::new(),
        "{}",
        text(&out.stdout)
    );
}

/// The seccomp profiles in hako's private directory that process `pid`
/// wrote (they are named after it).
fn profiles_of(pid: u32) -> Vec<String> {
    let dir = hako_container::private::private_dir().unwrap();
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with(&format!("hako-seccomp-{pid}-")))
        .collect()
}

#[test]
fn containers_image_build_writes_a_root_directory_with_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("img");
    let out = hako()
        .args(["image", "build", "--no-import", "--dir"])
        .arg(&root)
        .output()
        .unwrap();
    if !out.status.success() && !must_work() {
        eprintln!("SKIPPED: {}", text(&out.stderr));
        return;
    }
    assert!(out.status.success(), "{}", text(&out.stderr));
    let sh = Command::new(root.join("bin/sh"))
        .args(["-c", "echo ok"])
        .output()
        .unwrap();
    assert_eq!(sh.stdout, b"ok\n");
}

#[test]
fn containers_gc_runs_and_a_timeout_says_not_to_retry_blindly() {
    if !works("docker") {
        return;
    }
    let out = hako().arg("gc").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dir = tempfile::tempdir().unwrap();
    let out = hako()
        .args([
            "run",
            "--backend",
            "docker",
            "--timeout",
            "1s",
            "--workspace",
        ])
        .arg(dir.path())
        .args(["--", "sleep", "100"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(124));
    let err = text(&out.stderr);
    assert!(err.contains("timed out after 1s"), "{err}");
    assert!(err.contains("will time out again"), "{err}");
}

/// A gVisor bundle as hako writes one, of a hako process that is gone
/// (pid 2^22 + 1 never runs): an `owner` file, and a `state` with
/// something in it; owned by `uid`.
fn dead_bundle(dir: &std::path::Path, name: &str, uid: u32) -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    let bundle = dir.join(name);
    let mut private = std::fs::DirBuilder::new();
    private.mode(0o700);
    private.create(&bundle).unwrap();
    std::fs::write(bundle.join("owner"), "4194305 77\n").unwrap();
    private.create(bundle.join("state")).unwrap();
    std::fs::write(bundle.join("state/container"), "x").unwrap();
    for path in ["", "owner", "state", "state/container"] {
        std::os::unix::fs::lchown(bundle.join(path), Some(uid), Some(uid)).unwrap();
    }
    bundle
}

#[test]
fn containers_gc_hands_runsc_only_this_users_bundles_in_its_private_directory() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().unwrap();
    if std::fs::metadata(tmp.path()).unwrap().uid() != 0 {
        let reason = "needs root to plant a bundle another user owns";
        assert!(!must_work(), "{reason}");
        eprintln!("SKIPPED: {reason}");
        return;
    }
    // A runtime directory of hako's private one, and a shared temporary
    // directory like /tmp, both of this test's own.
    let runtime = tmp.path().join("runtime");
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&runtime).unwrap();
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&runtime, PermissionsExt::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&shared, PermissionsExt::from_mode(0o1777)).unwrap();
    let private = runtime.join("hako");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, PermissionsExt::from_mode(0o700)).unwrap();
    // A runsc that says it has a container, and notes how it was run.
    let calls = tmp.path().join("calls");
    let runsc = tmp.path().join("runsc");
    std::fs::write(
        &runsc,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\ncase \"$*\" in *list*) echo hako-1;; esac\n",
            calls.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&runsc, PermissionsExt::from_mode(0o755)).unwrap();
    let mine = dead_bundle(&private, "hako-gvisor-4194305-mine", 0);
    let planted = dead_bundle(&private, "hako-gvisor-4194305-planted", 65534);
    // Where bundles used to be: not looked at any more, whoever owns them.
    let old_theirs = dead_bundle(&shared, "hako-gvisor-4194305-theirs", 65534);
    let old_mine = dead_bundle(&shared, "hako-gvisor-4194305-old", 0);
    let out = hako()
        .arg("gc")
        .env("XDG_RUNTIME_DIR", &runtime)
        .env("TMPDIR", &shared)
        .env("HAKO_RUNSC", &runsc)
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    let state = mine.join("state");
    assert_eq!(
        std::fs::read_to_string(&calls).unwrap_or_default(),
        format!(
            "--root {0} list -q\n--root {0} delete --force hako-1\n",
            state.display()
        ),
    );
    assert!(
        stdout.contains(&format!("removed gvisor bundle {}", mine.display())),
        "{stdout}"
    );
    assert!(!mine.exists());
    assert!(
        stderr.contains(&format!("skipped {} is not hako's", planted.display())),
        "{stderr}"
    );
    assert!(stderr.contains("owned by uid 65534"), "{stderr}");
    for bundle in [&planted, &old_theirs, &old_mine] {
        assert!(bundle.join("state/container").exists(), "{bundle:?}");
    }
}

/// This process's `hako` children's gVisor bundles (by the owner pid in
/// their name) that are still in hako's private directory.
fn bundles_of(pid: u32) -> Vec<std::path::PathBuf> {
    let prefix = format!("hako-gvisor-{pid}-");
    std::fs::read_dir(hako_container::private::private_dir().unwrap())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Waits (at most a minute: a bound, not a measurement) for `pid`'s
/// bundles to be gone; the ones left.
fn bundles_left_by(pid: u32) -> Vec<std::path::PathBuf> {
    let start = Instant::now();
    loop {
        let left = bundles_of(pid);
        if left.is_empty() || start.elapsed() > Duration::from_secs(60) {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `hako run --backend gvisor` of a shell script in `ws`, started.
fn gvisor_run(
    ws: &std::path::Path,
    script: &str,
    stdout: fn() -> Stdio,
    stderr: fn() -> Stdio,
) -> std::process::Child {
    hako()
        .args(["run", "--backend", "gvisor", "--workspace"])
        .arg(ws)
        .args(["--", "sh", "-c", script])
        .stdout(stdout())
        .stderr(stderr())
        .spawn()
        .unwrap()
}

/// A one-command `hako run` on gVisor exits once its command is reported
/// and leaves the sandbox's teardown to the cleaner the guest's
/// `--host-view` mode forked: its exit code is the command's, and the
/// bundle (the root view, `config.json`, runsc's state) is removed after
/// it. So it is when hako is killed with SIGKILL mid-command: the cleaner
/// waits for runsc, which the closed pipes end.
#[test]
fn containers_a_gvisor_run_leaves_no_bundle_even_when_hako_is_killed() {
    if !works("gvisor") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let child = gvisor_run(dir.path(), "echo out; exit 7", Stdio::piped, Stdio::piped);
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "out\n");
    assert_eq!(bundles_left_by(pid), Vec::<std::path::PathBuf>::new());

    let mut child = gvisor_run(
        dir.path(),
        "touch started; sleep 1000",
        Stdio::null,
        Stdio::null,
    );
    let pid = child.id();
    let start = Instant::now();
    while !dir.path().join("started").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the command never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(bundles_of(pid).len(), 1, "the running sandbox's bundle");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(bundles_left_by(pid), Vec::<std::path::PathBuf>::new());
}

/// `hako run --backend gvisor --cow --name N --state DIR`: the command
/// changes the workspace it sees and the real one is untouched; `hako diff
/// N` shows every change and `hako commit N` applies them, after which the
/// workspace is what the sandbox saw.
#[test]
fn containers_a_gvisor_cow_run_is_shown_by_hako_diff_and_applied_by_hako_commit() {
    if !works("gvisor") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    std::fs::write(ws.join("b.txt"), "bee\n").unwrap();
    let state = dir.path().join("state");
    let named = |args: &[&str]| {
        hako()
            .args(args)
            .arg("--state")
            .arg(&state)
            .output()
            .unwrap()
    };
    let out = hako()
        .args([
            "run",
            "--backend",
            "gvisor",
            "--cow",
            "--name",
            "gv",
            "--state",
        ])
        .arg(&state)
        .arg("--workspace")
        .arg(&ws)
        .args([
            "--",
            "sh",
            "-c",
            "echo two >> a.txt && rm b.txt && mkdir c && echo new > c/new.txt && cat a.txt",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\ntwo\n");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "one\n");
    assert!(ws.join("b.txt").exists() && !ws.join("c").exists());
    let diff = named(&["diff", "gv"]);
    assert!(diff.status.success(), "{}", text(&diff.stderr));
    let shown = text(&diff.stdout);
    for part in [
        "--- a/a.txt\n+++ b/a.txt\n@@ -1 +1,2 @@\n one\n+two\n",
        "deleted file mode 100644\n--- a/b.txt\n+++ /dev/null\n",
        "new file mode 100644\n--- /dev/null\n+++ b/c/new.txt\n",
    ] {
        assert!(shown.contains(part), "{part:?} not in {shown}");
    }
    let commit = named(&["commit", "gv"]);
    assert!(commit.status.success(), "{}", text(&commit.stderr));
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert!(!ws.join("b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(ws.join("c/new.txt")).unwrap(),
        "new\n"
    );
    assert!(named(&["rm", "gv"]).status.success());
}

/// `hako shell` with `backend` (its flags) on a real terminal: Ctrl-C and
/// Ctrl-\\ end the interactive shell's foreground job, Ctrl-Z stops it,
/// and each time the shell prompts again and runs the next line; the shell
/// then ends as asked and hako exits with its status. (gVisor before
/// release-20230227.0 sends no terminal signal: the guest has the
/// command's supervisor, which leads the terminal's session, signal the
/// foreground group.)
fn ctrl_c_ctrl_backslash_and_ctrl_z_reach_the_foreground_job_of_hako_shell(backend: &[&str]) {
    let Some(tmux) = Tmux::start() else { return };
    let ws = tempfile::tempdir().unwrap();
    let line = format!(
        "{} shell {} --workspace {}",
        env!("CARGO_BIN_EXE_hako"),
        backend.join(" "),
        ws.path().display()
    );
    tmux.send(&[&line, "Enter"]);
    tmux.send(&["echo READY-$((6*7))", "Enter"]);
    tmux.wait_for("READY-42");
    // Each job is in the foreground when its key is typed (the line shows
    // `started` first); the shell runs the next line only once the sleep
    // (of hours) has ended, and after Ctrl-C, not the rest of its line.
    for (n, key) in [(1, "C-c"), (2, "C-\\")] {
        let rest = if n == 1 { "; echo slept1-$((1+1))" } else { "" };
        tmux.send(&[
            &format!("echo started{n}-$((1+{n})); sleep 1000{rest}"),
            "Enter",
        ]);
        tmux.wait_for(&format!("started{n}-{}", 1 + n));
        std::thread::sleep(Duration::from_millis(300));
        tmux.send(&[key]);
        tmux.send(&[&format!("echo after{n}-$((2+3))"), "Enter"]);
        let screen = tmux.wait_for(&format!("after{n}-5"));
        assert!(!screen.contains("slept1-2"), "{key}: {screen}");
    }
    tmux.send(&["echo started3-$((1+3)); sleep 1002", "Enter"]);
    tmux.wait_for("started3-4");
    std::thread::sleep(Duration::from_millis(300));
    tmux.send(&["C-z"]);
    tmux.send(&["jobs; echo after3-$((2+3))", "Enter"]);
    let screen = tmux.wait_for("after3-5");
    assert!(screen.contains("Stopped"), "Ctrl-Z: {screen}");
    // The stopped job is killed, and the shell ends with the status asked.
    tmux.send(&["kill -9 %1; wait; echo killed-$((1+1))", "Enter"]);
    tmux.wait_for("killed-2");
    tmux.send(&["exit 7", "Enter"]);
    let start = Instant::now();
    let mut asked_again = false;
    while hako_shell_runs(&line) {
        // The shell may not have taken the killed job's end in yet and
        // warn of stopped jobs ("You have stopped jobs." or, from bash
        // 5.2, "There are stopped jobs."): a second exit ends it, as at a
        // terminal.
        if !asked_again && tmux.screen().contains("stopped jobs.") {
            tmux.send(&["exit 7", "Enter"]);
            asked_again = true;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "hako shell did not exit:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Typed only once hako is gone (before, hako would relay it inside).
    tmux.send(&["echo code-$?-$((1+1))", "Enter"]);
    let screen = tmux.wait_for("-2\n");
    assert!(screen.contains("code-7-2"), "{screen}");
}

/// Whether a process runs with the command line `line` (words joined by
/// spaces).
fn hako_shell_runs(line: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim_end() == line)
    })
}

#[test]
fn containers_ctrl_c_ctrl_backslash_and_ctrl_z_reach_the_foreground_job_of_hako_shell_on_gvisor() {
    if works("gvisor") {
        ctrl_c_ctrl_backslash_and_ctrl_z_reach_the_foreground_job_of_hako_shell(&[
            "--backend",
            "gvisor",
        ]);
    }
}

#[test]
fn containers_ctrl_c_ctrl_backslash_and_ctrl_z_reach_the_foreground_job_of_hako_shell_on_docker_runsc(
) {
    if works("docker") {
        ctrl_c_ctrl_backslash_and_ctrl_z_reach_the_foreground_job_of_hako_shell(&[
            "--backend",
            "docker",
            "--runtime",
            "runsc",
        ]);
    }
}

/// A minimal Debian-like root directory made from the host's own files
/// (no registry, no debootstrap): the host's `/bin/sh` (dash on Debian)
/// with the libraries and loader it links, `/etc/debian_version`, and the
/// mount points. Nothing of busybox.
fn debian_like_root(root: &std::path::Path) {
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    let ldd = Command::new("ldd").arg(&sh).output().unwrap();
    assert!(
        ldd.status.success(),
        "ldd {}: {}",
        sh.display(),
        text(&ldd.stderr)
    );
    // Lines are "name => /path (addr)" or "/path (addr)".
    let libs: Vec<std::path::PathBuf> = text(&ldd.stdout)
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = l.rsplit_once("=> ").map_or(l, |(_, p)| p);
            path.split_whitespace()
                .next()
                .filter(|p| p.starts_with('/'))
                .map(Into::into)
        })
        .collect();
    assert!(
        libs.iter().any(|l| l.to_string_lossy().contains("libc.so")),
        "{libs:?}"
    );
    for dir in ["bin", "etc", "tmp", "proc", "dev", "sys", "root"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::copy(&sh, root.join("bin/sh")).unwrap();
    for lib in &libs {
        let inside = root.join(lib.strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::copy(lib, &inside).unwrap();
    }
    let version =
        std::fs::read_to_string("/etc/debian_version").unwrap_or_else(|_| "12.0\n".into());
    std::fs::write(root.join("etc/debian_version"), version).unwrap();
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(root.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
}

/// Commands and file operations in a sandbox of `image_args`: a shell
/// command that reads the image's `/etc/debian_version` with the shell's
/// own builtins, and `hako fs` writing, reading and listing.
fn exec_and_files_in(image_args: &[&str], ws: &std::path::Path) {
    use std::io::Write;
    let out = hako()
        .arg("run")
        .args(image_args)
        .arg("--workspace")
        .arg(ws)
        .args([
            "--",
            "sh",
            "-c",
            "read v < /etc/debian_version && echo \"debian $v\" && echo made > made-inside && test ! -e /bin/busybox",
        ])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{image_args:?}: {stdout} {}",
        text(&out.stderr)
    );
    assert!(stdout.starts_with("debian "), "{image_args:?}: {stdout}");
    assert_eq!(
        std::fs::read_to_string(ws.join("made-inside")).unwrap(),
        "made\n"
    );
    let fs = |args: &[&str], stdin: &[u8]| {
        let mut child = hako()
            .arg("fs")
            .args(image_args)
            .arg("--workspace")
            .arg(ws)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{image_args:?} fs {args:?}: {}",
            text(&out.stderr)
        );
        text(&out.stdout)
    };
    fs(&["write", "notes.txt"], b"from the host\n");
    assert_eq!(fs(&["read", "notes.txt"], b""), "from the host\n");
    let listed = fs(&["ls", "."], b"");
    assert!(
        listed.contains("notes.txt") && listed.contains("made-inside"),
        "{listed}"
    );
}

#[test]
fn containers_an_image_from_a_debian_root_directory_runs_commands_and_files() {
    if !works("docker") || !works("gvisor") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("rootfs");
    debian_like_root(&root);
    // Imported into Docker as the README says for an image of one's own.
    let tag = format!("hako-test-debian-{}:latest", std::process::id());
    let import = Command::new("sh")
        .args([
            "-c",
            "tar --numeric-owner -C \"$0\" -c . | docker import - \"$1\"",
        ])
        .arg(&root)
        .arg(&tag)
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "docker import: {}",
        text(&import.stderr)
    );
    let root_arg = root.to_str().unwrap().to_string();
    for args in [
        vec!["--backend", "docker", "--image", tag.as_str()],
        vec![
            "--backend",
            "docker",
            "--runtime",
            "runsc",
            "--image",
            tag.as_str(),
        ],
        vec!["--backend", "gvisor", "--image", root_arg.as_str()],
    ] {
        let ws = tempfile::tempdir().unwrap();
        exec_and_files_in(&args, &ws.path().canonicalize().unwrap());
    }
    let _ = Command::new("docker")
        .args(["image", "rm", "-f", &tag])
        .output();
}

#[test]
fn containers_servers_refuse_to_start_on_a_runtime_or_an_image_docker_does_not_have() {
    if !works("docker") {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    for (cmd, extra) in [
        ("mcp", &[][..]),
        ("serve", &["--listen", "127.0.0.1:0"][..]),
    ] {
        let out = hako()
            .args([
                cmd,
                "--backend",
                "docker",
                "--runtime",
                "hako-no-such-runtime",
            ])
            .arg("--workspace")
            .arg(ws.path())
            .args(extra)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{cmd}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{cmd}: {stderr}");
        assert!(
            stderr.contains("the docker backend cannot start here: dockerd has no runtime named hako-no-such-runtime; hint: install hako-no-such-runtime"),
            "{cmd}: {stderr}"
        );
    }
    // An image of one's own that is not there is named too (never pulled).
    let out = hako()
        .args([
            "mcp",
            "--backend",
            "docker",
            "--image",
            "hako-no-such-image:latest",
        ])
        .arg("--workspace")
        .arg(ws.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("image hako-no-such-image:latest is not present; hint: build or load it"),
        "{stderr}"
    );
}
