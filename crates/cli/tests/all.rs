//! End-to-end tests of the `hako` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod files;
mod lost;
mod readme;
mod review;
mod serve;
mod terminal;
#[path = "support/tmux.rs"]
mod tmux;
use tmux::Tmux;

fn hako() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hako"))
}

struct Dirs {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&ws).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), "OUTSIDE-SECRET").unwrap();
    Dirs {
        _tmp: tmp,
        ws,
        outside,
    }
}

fn run_in(ws: &Path, args: &[&str]) -> Output {
    hako()
        .arg("run")
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn fs_in(ws: &Path, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = hako()
        .arg("fs")
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // hako may exit (a refusal) before it reads its input: a broken pipe
    // here is expected then.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let cmdline = text(&cmdline).replace('\0', " ");
            if cmdline.contains(marker) {
                found.push(format!(
                    "{}: {cmdline}",
                    entry.file_name().to_string_lossy()
                ));
            }
        }
    }
    found
}

#[test]
fn run_echo_prints_hi() {
    let d = dirs();
    let out = run_in(&d.ws, &["--", "echo", "hi"]);
    assert_eq!(text(&out.stdout), "hi\n");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn hako_started_with_stdout_closed_prints_its_result_into_no_file_it_opens() {
    // A caller that starts hako with descriptor 1 closed: the audit log,
    // opened next, must not take its number and receive the JSON result.
    let d = dirs();
    let log = d.outside.join("audit.log");
    let out = Command::new("sh")
        .args(["-c", "exec \"$0\" \"$@\" >&-"])
        .arg(env!("CARGO_BIN_EXE_hako"))
        .args(["run", "--backend", "host", "--json", "--workspace"])
        .arg(&d.ws)
        .arg("--audit")
        .arg(&log)
        .args(["--", "echo", "into-the-void"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(written.contains("\"exec\""), "{written}");
    assert!(!written.contains("exit_code\":0,\"signal"), "{written}");
    let verify = hako().args(["audit", "verify"]).arg(&log).output().unwrap();
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify.stdout));
}

#[test]
fn hako_whose_output_pipe_is_closed_is_not_killed_by_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    let d = dirs();
    let mut child = hako()
        .args(["run", "--backend", "host", "--workspace"])
        .arg(&d.ws)
        .args(["--", "sh", "-c", "echo one; sleep 0.2; echo two"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Nobody reads: every write hako makes to its stdout fails with EPIPE.
    drop(child.stdout.take());
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), None, "{status:?}");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn run_uses_the_current_directory_as_workspace_by_default() {
    let d = dirs();
    let out = hako()
        .args(["run", "--", "pwd"])
        .current_dir(&d.ws)
        .output()
        .unwrap();
    let expected = std::fs::canonicalize(&d.ws).unwrap();
    assert_eq!(text(&out.stdout).trim_end(), expected.to_str().unwrap());
}

#[test]
fn exit_codes_follow_the_container_tools() {
    let d = dirs();
    let code = |args: &[&str]| run_in(&d.ws, args).status.code();
    assert_eq!(code(&["--", "sh", "-c", "exit 3"]), Some(3));
    assert_eq!(code(&["--", "sh", "-c", "kill -TERM $$"]), Some(128 + 15));
    assert_eq!(code(&["--timeout", "200ms", "--", "sleep", "5"]), Some(124));
    assert_eq!(code(&["--", "no-such-program-hako"]), Some(127));
    std::fs::write(d.ws.join("noexec.sh"), "#!/bin/sh\necho no\n").unwrap();
    assert_eq!(code(&["--", "./noexec.sh"]), Some(126));
    assert_eq!(code(&["--cwd", "../", "--", "true"]), Some(125));
    assert_eq!(code(&["--min-isolation", "vm", "--", "true"]), Some(125));
}

#[test]
fn timeout_kills_setsid_and_background_children() {
    let d = dirs();
    let marker = format!("{}", 30_000_000 + std::process::id());
    let script =
        format!("sleep {marker}1 & setsid sleep {marker}2 & (sleep {marker}3 &); sleep {marker}4");
    let start = Instant::now();
    let out = run_in(&d.ws, &["--timeout", "1s", "--", "sh", "-c", &script]);
    let took = start.elapsed();
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
    // A hang guard, not a timing assertion: the bound is 3 s.
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_eq!(processes_with(&marker), Vec::<String>::new());
    assert!(text(&out.stderr).contains("timed out"));
}

#[test]
fn json_flood_is_truncated_and_hako_stays_small() {
    use std::io::Read;
    let d = dirs();
    // Waited for below, by wait4, which also gives its peak.
    #[allow(clippy::zombie_processes)]
    let mut child = hako()
        .arg("run")
        .arg("--workspace")
        .arg(&d.ws)
        .args(["--json", "--", "sh", "-c", "yes | head -c 500000000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        stdout.read_to_end(&mut all).unwrap();
        all
    });
    // This hako's own peak, not the largest of every child the test
    // binary has had (the other tests run beside this one).
    let (status, peak) = hako_sys::wait_with_peak_rss(child.id()).unwrap();
    let stdout = reader.join().unwrap();
    let status =
        <std::process::ExitStatus as std::os::unix::process::ExitStatusExt>::from_raw(status);
    assert_eq!(status.code(), Some(0), "{status:?}");
    let v: serde_json::Value = serde_json::from_slice(&stdout).unwrap();
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["stdout_bytes"], 500_000_000u64);
    assert_eq!(v["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["timed_out"], false);
    // `--backend auto` picks the strongest backend that works here.
    let (backend, isolation) = (v["backend"].as_str(), v["isolation"].as_str());
    assert!(
        matches!(
            (backend, isolation),
            (Some("linux" | "landlock"), Some("process"))
        ),
        "{backend:?} {isolation:?}"
    );
    // And says why.
    let choice = v["backend_choice"].as_str().unwrap_or_default();
    assert!(choice.starts_with(backend.unwrap_or("?")), "{choice}");
    for key in ["signal", "stderr", "stderr_truncated", "duration_ms"] {
        assert!(v.get(key).is_some(), "{key} missing");
    }
    assert!(peak < 64 << 20, "peak RSS {peak} bytes");
}

#[test]
fn max_output_flag_caps_live_output() {
    let d = dirs();
    let out = run_in(
        &d.ws,
        &[
            "--max-output",
            "10K",
            "--",
            "sh",
            "-c",
            "yes | head -c 100000",
        ],
    );
    assert_eq!(out.stdout.len(), 10 << 10);
    assert!(text(&out.stderr).contains("truncated"));
}

#[test]
fn env_is_sanitised_and_flags_pass_variables() {
    let d = dirs();
    let out = hako()
        .args(["run", "--workspace"])
        .arg(&d.ws)
        .args([
            "--env",
            "SET_HERE=1",
            "--pass-env",
            "HAKO_TEST_VISIBLE",
            "--pass-env",
            "HAKO_TEST_NAMED_TOKEN",
            "--",
            "env",
        ])
        .env("HAKO_TEST_VISIBLE", "yes")
        .env("HAKO_TEST_NAMED_TOKEN", "named")
        .env("HAKO_TEST_OTHER_TOKEN", "leak")
        .env("AWS_SECRET_ACCESS_KEY", "leak")
        .env("EDITOR", "leak-not-allowlisted")
        .output()
        .unwrap();
    let env = text(&out.stdout);
    assert!(env.contains("SET_HERE=1\n"), "{env}");
    assert!(env.contains("HAKO_TEST_VISIBLE=yes\n"), "{env}");
    assert!(env.contains("HAKO_TEST_NAMED_TOKEN=named\n"), "{env}");
    assert!(!env.contains("leak"), "{env}");
}

#[test]
fn stdin_flag_feeds_the_command() {
    let d = dirs();
    let mut child = hako()
        .args(["run", "--stdin", "--workspace"])
        .arg(&d.ws)
        .args(["--", "wc", "-c"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&vec![b'x'; 300_000])
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(text(&out.stdout).trim(), "300000");
}

#[test]
fn stdin_larger_than_a_socket_buffer_comes_back_whole_through_cat_on_linux() {
    // The guest echoes output while hako still writes the input: hako
    // must read while it writes, or both wait for each other forever.
    let d = dirs();
    let input: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let mut child = hako()
        .args([
            "run",
            "--backend",
            "linux",
            "--stdin",
            "--max-output",
            "16M",
        ])
        .arg("--workspace")
        .arg(&d.ws)
        .args(["--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let feed = input.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&feed));
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut got).map(|_| got)
    });
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("hako run --stdin -- cat of 8 MiB did not finish in 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    writer.join().unwrap().unwrap();
    let got = reader.join().unwrap().unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));
    assert_eq!(got.len(), input.len());
    assert!(got == input, "the output differs from the input");
}

#[test]
fn fs_round_trip() {
    let d = dirs();
    assert!(fs_in(&d.ws, &["mkdir", "a/b"], b"").status.success());
    assert!(fs_in(&d.ws, &["write", "a/b/f.txt"], b"hello")
        .status
        .success());
    assert!(fs_in(&d.ws, &["append", "a/b/f.txt"], b" world")
        .status
        .success());
    let out = fs_in(&d.ws, &["read", "a/b/f.txt"], b"");
    assert_eq!(text(&out.stdout), "hello world");
    let out = fs_in(&d.ws, &["read", "a/b/f.txt", "--max-bytes", "5"], b"");
    assert_eq!(text(&out.stdout), "hello");
    assert!(text(&out.stderr).contains("truncated"));
    symlink("f.txt", d.ws.join("a/b/link")).unwrap();
    let out = fs_in(&d.ws, &["--json", "ls", "a/b"], b"");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kinds: Vec<(&str, &str)> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(kinds, [("f.txt", "file"), ("link", "symlink")]);
    let out = fs_in(&d.ws, &["stat", "a/b/link"], b"");
    assert!(text(&out.stdout).contains("kind: symlink"));
    assert!(text(&out.stdout).contains("target: f.txt"));
    assert!(fs_in(&d.ws, &["rm", "a/b/link"], b"").status.success());
    assert!(d.ws.join("a/b/f.txt").exists());
    let out = fs_in(&d.ws, &["rm", "a"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("not empty"));
    assert!(d.ws.join("a/b/f.txt").exists());
}

/// Every refusal: exit 1, one line on stderr naming the path, nothing changed.
#[test]
fn fs_refusals_print_one_line_and_change_nothing() {
    let d = dirs();
    symlink(&d.outside, d.ws.join("out_abs")).unwrap();
    symlink("../outside", d.ws.join("out_rel")).unwrap();
    symlink(d.outside.join("newfile"), d.ws.join("dangling_out")).unwrap();
    symlink("missing-inside", d.ws.join("dangling_in")).unwrap();
    symlink("/proc/self/root", d.ws.join("magic")).unwrap();
    symlink("loop_b", d.ws.join("loop_a")).unwrap();
    symlink("loop_a", d.ws.join("loop_b")).unwrap();
    let fifo = d.ws.join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let outside_abs = d.outside.join("secret");
    let outside_abs = outside_abs.to_str().unwrap();
    let long = "a/".repeat(2100);
    let long_name = "n".repeat(300);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["read", "../outside/secret"], "climbs out"),
        (vec!["write", "../outside/secret"], "climbs out"),
        (vec!["write", "a/../../outside/secret"], "climbs out"),
        (vec!["read", outside_abs], "absolute path outside"),
        (vec!["write", "/etc/hako-test"], "absolute path outside"),
        (vec!["read", "out_abs/secret"], "symlink"),
        (vec!["read", "out_rel/secret"], "symlink"),
        (vec!["write", "out_rel/secret"], "symlink"),
        (vec!["append", "out_abs/secret"], "symlink"),
        (vec!["ls", "out_abs"], "symlink"),
        (vec!["mkdir", "out_rel/newdir"], "symlink"),
        (vec!["rm", "out_abs/secret"], "symlink"),
        (vec!["stat", "out_abs/secret"], "symlink"),
        (vec!["write", "dangling_out"], "symlink"),
        (vec!["write", "dangling_in"], "dangling symlink"),
        (vec!["append", "dangling_in"], "dangling symlink"),
        (vec!["read", "magic/etc/passwd"], "symlink"),
        (vec!["read", "loop_a"], "loop"),
        (vec!["read", "fifo"], "FIFO"),
        (vec!["append", "fifo"], "FIFO"),
        (vec!["read", "a\u{1}b"], "does not exist"),
        (vec!["read", &long], "limit"),
        (vec!["write", &long_name], "limit"),
    ];
    for (args, expect) in &cases {
        let start = Instant::now();
        let out = fs_in(&d.ws, args, b"EVIL");
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(expect), "{args:?}: {stderr}");
        assert!(start.elapsed() < Duration::from_secs(30), "{args:?} hung");
    }
    // Nothing was created or changed outside, or through dangling links.
    let mut outside: Vec<_> = std::fs::read_dir(&d.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    outside.sort();
    assert_eq!(outside, ["secret"]);
    assert_eq!(
        std::fs::read_to_string(d.outside.join("secret")).unwrap(),
        "OUTSIDE-SECRET"
    );
    assert!(!d.ws.join("missing-inside").exists());
    assert!(std::fs::symlink_metadata(d.ws.join("dangling_in"))
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn fs_refuses_nul_bytes_in_paths() {
    use std::os::unix::ffi::OsStrExt;
    let d = dirs();
    // A NUL cannot travel in argv, so this goes through the library's path
    // check, which is what `hako fs` calls.
    let err = hako_core::path::relative(Path::new(std::ffi::OsStr::from_bytes(b"a\0b")), &d.ws)
        .unwrap_err();
    assert!(matches!(err, hako_core::FenceError::NulByte { .. }));
}

#[test]
fn doctor_reports_every_backend() {
    let out = hako().args(["doctor", "--json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["backend"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["vm", "gvisor", "docker", "linux", "landlock", "host"]
    );
    for b in v["backends"].as_array().unwrap() {
        if b["works"] == false {
            assert!(b["reason"].as_str().is_some_and(|r| !r.is_empty()));
            assert!(b["hint"].as_str().is_some_and(|r| !r.is_empty()));
        }
    }
    // `auto` is never `host`, and says why it picked what it did.
    let auto = v["auto"].as_str().unwrap();
    assert_ne!(auto, "host");
    let why = v["auto_why"].as_str().unwrap();
    assert!(
        why.starts_with(&format!(
            "{auto} is the strongest isolating backend that works here"
        )),
        "{why}"
    );
    // Each protection is checked on its own; this machine has all three,
    // and the linux backend works only when it does.
    let protections = v["protections"].as_array().unwrap();
    let names: Vec<&str> = protections
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["landlock", "seccomp", "user namespaces"]);
    let linux_works = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["backend"] == "linux" && b["works"] == true);
    for p in protections {
        assert!(p["detail"].as_str().is_some_and(|d| !d.is_empty()), "{p}");
        if linux_works {
            assert_eq!(p["available"], true, "{p}");
        }
    }
}

/// `hako doctor --json`'s reason and hint for `backend`, with `env` set.
fn doctor_says(backend: &str, env: &[(&str, &std::ffi::OsStr)]) -> (String, String) {
    let mut cmd = hako();
    cmd.args(["doctor", "--json"]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let b = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["backend"] == backend)
        .unwrap()
        .clone();
    assert_eq!(b["works"], false, "{b}");
    (
        b["reason"].as_str().unwrap().to_string(),
        b["hint"].as_str().unwrap().to_string(),
    )
}

#[test]
fn doctor_hints_follow_the_cause_found() {
    let d = dirs();
    let not_elf = d.outside.join("secret");
    // runsc missing: install it.
    let (reason, hint) = doctor_says(
        "gvisor",
        &[("HAKO_RUNSC", std::ffi::OsStr::new("/nonexistent/runsc"))],
    );
    assert!(reason.ends_with("is not installed"), "{reason}");
    assert!(hint.starts_with("install gVisor's runsc"), "{hint}");
    // runsc there (a stand-in that answers --version), the static guest
    // not: build the guest, not "install runsc".
    let (reason, hint) = doctor_says(
        "gvisor",
        &[
            ("HAKO_RUNSC", std::ffi::OsStr::new("/bin/true")),
            ("HAKO_GUEST_STATIC", not_elf.as_os_str()),
        ],
    );
    assert!(reason.contains("not a readable 64-bit ELF"), "{reason}");
    assert!(
        hint.starts_with("build it with `./scripts/build`"),
        "{hint}"
    );
    assert!(!hint.contains("install"), "{hint}");
    // No container engine at all: install one.
    let (reason, hint) = doctor_says(
        "docker",
        &[("HAKO_DOCKER", std::ffi::OsStr::new("/nonexistent/docker"))],
    );
    assert!(
        reason.contains("does not answer: not installed"),
        "{reason}"
    );
    assert!(hint.starts_with("install Docker"), "{hint}");
}

#[test]
fn bench_json_reports_ratios() {
    let out = hako()
        .args(["bench", "--json", "--iterations", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let comparisons = v["comparisons"].as_array().unwrap();
    let names: Vec<&str> = comparisons
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for expected in [
        "hako run --backend host -- true",
        "fence write 4 KiB",
        "fence read 4 KiB",
        "fence write 1 MiB",
        "fence read 1 MiB",
    ] {
        assert!(
            names.iter().any(|n| n.contains(expected)),
            "{expected} missing from {names:?}"
        );
    }
    for c in comparisons {
        assert!(c["ratio"].as_f64().unwrap() > 0.0);
    }
    // Each figure also by backend and plain name, as the comparison gives it.
    let host = &v["figures"]["host"];
    for figure in [
        "cold_run.ratio_vs_fork_exec",
        "warm_exec.ratio_vs_fork_exec",
        "fence_write_4k.ratio_vs_std_fs_write",
        "fence_read_1m.ratio_vs_std_fs_read",
    ] {
        let ratio = host[figure].as_f64();
        assert!(
            ratio.is_some_and(|r| r > 0.0),
            "{figure} missing from {host}"
        );
        let same = comparisons
            .iter()
            .find(|c| c["backend"] == "host" && c["figure"] == figure)
            .and_then(|c| c["ratio"].as_f64());
        assert_eq!(same, ratio, "{figure}");
    }
}

#[test]
fn killing_hako_with_sigkill_leaves_no_process() {
    let d = dirs();
    let marker = format!("{}", 40_000_000 + std::process::id());
    let script = format!("sleep {marker}1 & setsid sleep {marker}2 & sleep {marker}3");
    let mut child = hako()
        .args(["run", "--workspace"])
        .arg(&d.ws)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let sleeps = || {
        processes_with(&marker)
            .into_iter()
            .filter(|p| p.contains(&format!(": sleep {marker}")))
            .count()
    };
    let wait_for = |want_running: bool| {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            let n = sleeps();
            if (want_running && n == 3) || (!want_running && n == 0) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    };
    let started = wait_for(true);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(started, "the command never started");
    assert!(
        wait_for(false),
        "left behind: {:?}",
        processes_with(&format!("sleep {marker}"))
    );
}

#[test]
fn pid_1_shows_neither_hakos_arguments_nor_its_environment() {
    // The CLI runs the sandbox's pid 1 in a fork of itself: what hako was
    // given must not be readable inside through /proc, from pid 1 or from
    // the supervisor it forked (every process there is looked at).
    let d = dirs();
    let script = "for p in /proc/[0-9]*; do cat $p/cmdline; echo; cat $p/environ; echo; cat $p/comm; done 2>&1";
    let out = hako()
        .args([
            "run",
            "--backend",
            "linux",
            "--max-output",
            "7654321",
            "--workspace",
        ])
        .arg(&d.ws)
        .args(["--", "sh", "-c", script])
        .env("HAKO_TEST_SECRET_TOKEN", "hunter2-marker")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let shown = text(&out.stdout);
    assert!(out.status.success(), "{shown} {}", text(&out.stderr));
    // Its command line and its name, for pid 1 and for the supervisor.
    assert!(shown.matches("hako-guest").count() >= 4, "{shown}");
    for leak in [
        "7654321",
        "--workspace",
        "hunter2-marker",
        "HAKO_TEST_SECRET",
    ] {
        assert!(!shown.contains(leak), "{leak} visible inside: {shown}");
    }
}

#[test]
fn hako_shell_works_on_a_real_terminal_and_restores_it() {
    let Some(tmux) = Tmux::start() else { return };
    let d = dirs();
    let hako = env!("CARGO_BIN_EXE_hako");
    let line = format!(
        "{hako} shell --backend linux --workspace {}",
        d.ws.display()
    );
    tmux.send(&[&line, "Enter"]);
    tmux.send(&["echo READY-$((6*7)); stty size; tty", "Enter"]);
    tmux.wait_for("READY-42");
    tmux.wait_for("24 80");
    // Waited for, not read off the screen READY-42 showed on: `tty`
    // answers last, and under load the screen can be read before it does.
    let screen = tmux.wait_for("/dev/pts/");
    assert!(screen.contains("/dev/pts/"), "{screen}");
    // A window-size change reaches the shell inside.
    assert!(tmux
        .cmd(&["resize-window", "-t", "t", "-x", "100", "-y", "30"])
        .success());
    std::thread::sleep(Duration::from_millis(200));
    tmux.send(&["stty size", "Enter"]);
    tmux.wait_for("30 100");
    // Ctrl-C reaches the program in the sandbox, not hako.
    tmux.send(&["sleep 1000; echo slept-$((1+1))", "Enter"]);
    std::thread::sleep(Duration::from_millis(500));
    tmux.send(&["C-c"]);
    tmux.send(&["echo after-$((2+3))", "Enter"]);
    let screen = tmux.wait_for("after-5");
    assert!(!screen.contains("slept-2"), "{screen}");
    // Leaving the shell leaves hako, with the terminal as it was.
    tmux.send(&["exit 7", "Enter"]);
    // Typed only once hako is gone (before, hako would relay it inside).
    let ws = d.ws.display().to_string();
    let start = Instant::now();
    while processes_with(&ws).iter().any(|p| p.contains(" shell ")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "hako shell did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    tmux.send(&[
        "echo code-$?; stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e echo | tr '\\n' ' '; echo END-$((2+2))",
        "Enter",
    ]);
    let screen = tmux.wait_for("END-4");
    assert!(screen.contains("code-7"), "{screen}");
    assert!(screen.contains("icanon echo END-4"), "{screen}");
}

#[test]
fn hako_shell_cow_on_a_real_terminal_keeps_what_was_typed_in_its_layer_for_review() {
    let Some(tmux) = Tmux::start() else { return };
    let d = dirs();
    std::fs::write(d.ws.join("kept"), "kept\n").unwrap();
    let state = d.outside.join("state");
    let bin = env!("CARGO_BIN_EXE_hako");
    let line = format!(
        "{bin} shell --backend linux --cow --name typed --state {} --workspace {}",
        state.display(),
        d.ws.display()
    );
    tmux.send(&[&line, "Enter"]);
    tmux.send(&[
        "echo new > made; rm kept; cat made; echo DONE-$((6*7))",
        "Enter",
    ]);
    let screen = tmux.wait_for("DONE-42");
    assert!(screen.contains("\nnew\n"), "{screen}");
    tmux.send(&["exit", "Enter"]);
    let ws = d.ws.display().to_string();
    let start = Instant::now();
    while processes_with(&ws).iter().any(|p| p.contains(" shell ")) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "hako shell did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The workspace is as it was; the review shows what was typed.
    assert_eq!(
        std::fs::read_to_string(d.ws.join("kept")).unwrap(),
        "kept\n"
    );
    assert!(!d.ws.join("made").exists());
    let out = hako()
        .args(["diff", "typed", "--stat", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    let stat = text(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        stat.contains(" kept ") && stat.contains(" made ") && stat.contains(" 2 changes,"),
        "{stat}"
    );
    // And it is committed as reviewed.
    let out = hako()
        .args(["commit", "typed", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(d.ws.join("made")).unwrap(), "new\n");
    assert!(!d.ws.join("kept").exists());
}

#[test]
fn hako_alone_needs_no_guest_binary_beside_it() {
    // The CLI runs the guest's code in a fork of itself: a lone copy of
    // `hako` runs commands, and opens one sandbox after another (the guest
    // of a closed one is reaped first, so the process can fork again).
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("hako");
    std::fs::copy(env!("CARGO_BIN_EXE_hako"), &lone).unwrap();
    let d = dirs();
    let mut out = Command::new(&lone);
    out.args(["run", "--backend", "linux", "--workspace"])
        .arg(&d.ws)
        .args(["--", "echo", "alone"])
        .env_remove("HAKO_GUEST");
    let out = output_of_fresh_copy(&mut out);
    assert_eq!(text(&out.stdout), "alone\n", "{}", text(&out.stderr));
    let mut out = Command::new(&lone);
    out.args([
        "bench",
        "--json",
        "--iterations",
        "2",
        "--backend",
        "host",
        "--backend",
        "linux",
    ])
    .env_remove("HAKO_GUEST");
    let out = output_of_fresh_copy(&mut out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// One MCP tool call over stdio, the protocol spoken by hand (the Python
/// SDK's client drives the full server in `mcp.rs`): initialize, the
/// initialized notification, `tools/call` of `tool` with `args`. Returns
/// the call's result and what the server wrote on stderr.
fn mcp_tool_call(
    hako: &Path,
    backend: &str,
    ws: &Path,
    tool: &str,
    args: serde_json::Value,
) -> (serde_json::Value, String) {
    use std::io::{BufRead, Read};
    let mut cmd = Command::new(hako);
    cmd.args(["mcp", "--backend", backend, "--workspace"])
        .arg(ws)
        .env_remove("HAKO_GUEST")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = loop {
        match cmd.spawn() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => break other.unwrap(),
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut send = |v: serde_json::Value| {
        writeln!(stdin, "{v}").unwrap();
        stdin.flush().unwrap();
    };
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "hako-test", "version": "0"}}}),
    );
    let init: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(init["result"]["serverInfo"]["name"], "hako", "{init}");
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": tool, "arguments": args}}),
    );
    let reply: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    drop(stdin);
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}: {stderr}");
    assert_eq!(reply["id"], 2, "{reply}");
    (reply["result"].clone(), stderr)
}

#[test]
fn hako_alone_serves_mcp_tool_calls_with_the_guest_it_carries() {
    // `cargo install --path crates/cli` installs only `hako`: the MCP
    // server (many threads, so it starts the guest as a program) runs the
    // guest from `hako` itself, started as `hako-guest`.
    let dir = tempfile::tempdir().unwrap();
    let lone = dir.path().join("hako");
    std::fs::copy(env!("CARGO_BIN_EXE_hako"), &lone).unwrap();
    let d = dirs();
    for backend in ["linux", "landlock"] {
        let (result, stderr) = mcp_tool_call(
            &lone,
            backend,
            &d.ws,
            "run_command",
            serde_json::json!({"command": "echo alone"}),
        );
        assert_eq!(result["isError"], false, "{backend}: {result} {stderr}");
        let text = result["content"][0]["text"].as_str().unwrap_or_default();
        assert!(text.contains("alone\n"), "{backend}: {text}");
    }
    // And the guest it carries is exactly the guest: started by hand as
    // `hako-guest`, it says what `hako-guest` says.
    let carried = std::os::unix::process::CommandExt::arg0(&mut Command::new(&lone), "hako-guest")
        .output()
        .unwrap();
    let guest = Command::new(Path::new(env!("CARGO_BIN_EXE_hako")).with_file_name("hako-guest"))
        .output()
        .unwrap();
    assert_eq!(carried.status.code(), guest.status.code());
    assert_eq!(text(&carried.stderr), text(&guest.stderr));
    assert!(text(&carried.stderr).contains("no control socket at fd 3"));
}

#[test]
fn hako_mcp_and_serve_refuse_to_start_when_their_backend_cannot_run() {
    let d = dirs();
    let missing = d.outside.join("no-such-guest");
    for (cmd, extra) in [
        ("mcp", &[][..]),
        ("serve", &["--listen", "127.0.0.1:0"][..]),
    ] {
        let out = hako()
            .args([cmd, "--backend", "linux", "--workspace"])
            .arg(&d.ws)
            .args(extra)
            .env("HAKO_GUEST", &missing)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{cmd}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{cmd}: one line: {stderr}");
        assert!(
            stderr.contains("the linux backend cannot start here")
                && stderr.contains("no-such-guest")
                && stderr.contains("hint: set HAKO_GUEST"),
            "{cmd}: {stderr}"
        );
        assert!(!stderr.contains("listening"), "{cmd}: {stderr}");
    }
    // A gvisor image that is not a directory is named before serving.
    let out = hako()
        .args(["mcp", "--backend", "gvisor", "--image"])
        .arg(&missing)
        .arg("--workspace")
        .arg(&d.ws)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("the gvisor backend cannot start here") && stderr.contains("hint: "),
        "{stderr}"
    );
}

/// Runs a program that was just copied: another test's fork may still
/// hold the copy's write descriptor for a moment (until its exec), and
/// the kernel refuses to execute a file open for writing.
fn output_of_fresh_copy(cmd: &mut Command) -> Output {
    for _ in 0..100 {
        match cmd.output() {
            Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other.unwrap(),
        }
    }
    panic!("the copy stayed busy");
}

#[test]
fn net_flags_reach_the_sandbox_and_json_lists_every_proxy_decision() {
    let d = dirs();
    // A host service on loopback, forwarded into the sandbox.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"from-the-host\n").unwrap();
    });
    let allow = format!("localhost:{port}");
    let script = format!(
        "busybox nc 127.0.0.1 {port} </dev/null; busybox wget -q -O - http://other.test/ || echo refused"
    );
    let out = run_in(
        &d.ws,
        &[
            "--backend",
            "linux",
            "--allow",
            &allow,
            "--json",
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    server.join().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stdout = json["stdout"].as_str().unwrap();
    assert!(
        stdout.contains("from-the-host") && stdout.contains("refused"),
        "{json}"
    );
    assert_eq!(json["network_access"], "allowlist", "{json}");
    let events = json["network"].as_array().unwrap();
    assert!(
        events
            .iter()
            .any(|e| e["decision"] == "allowed" && e["port"] == port && e["bytes_down"] == 14),
        "{json}"
    );
    assert!(
        events.iter().any(|e| e["decision"] == "refused"
            && e["host"] == "other.test"
            && e["rule"] == "not-on-allowlist"),
        "{json}"
    );
    // Without --json, each refusal is one line on stderr.
    let out = run_in(
        &d.ws,
        &[
            "--backend",
            "linux",
            "--allow",
            &allow,
            "--",
            "busybox",
            "wget",
            "-q",
            "http://other.test/",
        ],
    );
    let err = text(&out.stderr);
    assert!(
        err.contains("egress proxy refused other.test:80 (rule not-on-allowlist)"),
        "{err}"
    );
}

#[test]
fn net_modes_a_backend_cannot_enforce_are_refused_by_name() {
    let d = dirs();
    for (args, expect) in [
        (
            &["--backend", "host", "--net", "none"][..],
            "cannot provide network mode `none`",
        ),
        (
            &["--backend", "host", "--allow", "example.org"][..],
            "cannot provide network mode `allow`",
        ),
        (
            &[
                "--backend",
                "linux",
                "--net",
                "none",
                "--allow",
                "example.org",
            ][..],
            "use --net allow",
        ),
        (
            &["--backend", "linux", "--allow", "*"][..],
            "invalid network policy",
        ),
    ] {
        let mut all = args.to_vec();
        all.extend(["--", "true"]);
        let out = run_in(&d.ws, &all);
        assert_eq!(out.status.code(), Some(125), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    // `host` is asked for by name and shows in what the sandbox reports.
    let out = run_in(
        &d.ws,
        &[
            "--backend",
            "linux",
            "--net",
            "host",
            "--json",
            "--",
            "sh",
            "-c",
            "echo \"[$HTTP_PROXY]\"",
        ],
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["stdout"], "[]\n", "{json}");
    assert_eq!(json["network_access"], "host", "{json}");
    assert!(json.get("network").is_none(), "{json}");
    let out = run_in(&d.ws, &["--backend", "linux", "--json", "--", "true"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["network_access"], "none", "{json}");
}

#[test]
fn profile_keys_set_the_sandbox_and_flags_win_or_add() {
    let d = dirs();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"profiled\n").unwrap();
    });
    let profile = d.ws.join("hako.toml");
    std::fs::write(
        &profile,
        format!(
            "backend = \"host\"\nnet = \"allow\"\nallow = [\"localhost:{port}\"]\nenv = {{ FROM_PROFILE = \"p\" }}\nmax_output = \"1K\"\n"
        ),
    )
    .unwrap();
    let profile = profile.to_str().unwrap();
    // --backend on the command line wins over the profile's `host` (which
    // would refuse `allow`); --env adds to the profile's table.
    let out = run_in(
        &d.ws,
        &[
            "--profile", profile, "--backend", "linux", "--env", "FROM_FLAG=f", "--json", "--",
            "sh", "-c",
            &format!("echo $FROM_PROFILE$FROM_FLAG; busybox nc 127.0.0.1 {port} </dev/null; head -c 5000 /dev/zero"),
        ],
    );
    server.join().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stdout = json["stdout"].as_str().unwrap();
    assert!(stdout.starts_with("pf\nprofiled\n"), "{json}");
    assert_eq!(
        json["stdout_truncated"], true,
        "max_output from the profile: {json}"
    );
    assert_eq!(json["backend"], "linux");
    // An unknown key is named, and nothing runs.
    let bad = d.ws.join("bad.toml");
    std::fs::write(&bad, "netwrok = \"allow\"\n").unwrap();
    let out = run_in(&d.ws, &["--profile", bad.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("netwrok"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn kill_9_of_hako_leaves_an_egress_proxy_directory_that_gc_removes() {
    let d = dirs();
    let tmp = tempfile::tempdir().unwrap();
    let mut child = hako()
        .env("TMPDIR", tmp.path())
        .args([
            "run",
            "--backend",
            "linux",
            "--allow",
            "localhost:1",
            "--workspace",
        ])
        .arg(&d.ws)
        .args(["--", "sleep", "60"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let prefix = format!("hako-net-{}-", child.id());
    let listed = || -> Vec<PathBuf> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while listed().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let dirs_left = listed();
    assert_eq!(dirs_left.len(), 1, "no proxy directory appeared");
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(dirs_left[0].exists());
    let out = hako().env("TMPDIR", tmp.path()).arg("gc").output().unwrap();
    assert!(
        text(&out.stdout).contains("removed egress proxy directory"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(!dirs_left[0].exists());
}

#[test]
fn audit_log_records_runs_and_verify_names_an_edited_removed_or_reordered_line() {
    let d = dirs();
    let log = d.outside.join("audit.log");
    let log_s = log.to_str().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"x").unwrap();
    });
    let allow = format!("localhost:{port}");
    let nc = format!("busybox nc 127.0.0.1 {port} </dev/null");
    for args in [
        vec!["--audit", log_s, "--", "echo", "one"],
        vec![
            "--backend",
            "linux",
            "--allow",
            &allow,
            "--audit",
            log_s,
            "--",
            "sh",
            "-c",
            &nc,
        ],
        vec!["--min-isolation", "vm", "--audit", log_s, "--", "true"],
    ] {
        run_in(&d.ws, &args);
    }
    server.join().unwrap();
    let verify = |path: &Path| hako().args(["audit", "verify"]).arg(path).output().unwrap();
    let out = verify(&log);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    let show = hako().args(["audit", "show"]).arg(&log).output().unwrap();
    let shown = text(&show.stdout);
    assert!(shown.contains("exec") && shown.contains("echo"), "{shown}");
    assert!(
        shown.contains("net") && shown.contains(&format!("port={port}")),
        "{shown}"
    );
    assert!(shown.contains("refusal") && shown.contains("vm"), "{shown}");
    // `hako audit show LOG | head`: a reader that has gone is not an error
    // (no panic, exit 0), in either form.
    for json in [false, true] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = hako();
        cmd.args(["audit", "show"]).arg(&log).stdout(writer);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let lines: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert!(lines.len() >= 6, "{lines:?}");
    // The records are hako-audit's typed ones: the run's exec says which
    // front end and backend ran it, the refused run is a refusal.
    let records: Vec<serde_json::Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let exec = records
        .iter()
        .find(|r| r["kind"] == "exec" && r["argv"] == serde_json::json!(["echo", "one"]))
        .unwrap_or_else(|| panic!("no exec of echo one in {records:?}"));
    assert_eq!(exec["front_end"], "run", "{exec}");
    assert_eq!(exec["exit_code"], 0, "{exec}");
    assert!(exec["backend"].is_string(), "{exec}");
    let refusal = records
        .iter()
        .find(|r| r["kind"] == "refusal")
        .unwrap_or_else(|| panic!("no refusal in {records:?}"));
    assert_eq!(refusal["front_end"], "run", "{refusal}");
    assert_eq!(refusal["argv"], serde_json::json!(["true"]), "{refusal}");
    let tampered = d.ws.join("tampered.log");
    let check = |lines: &[String], want: usize| {
        std::fs::write(&tampered, lines.join("\n") + "\n").unwrap();
        let out = verify(&tampered);
        let said = text(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{said}");
        assert!(said.contains(&format!("line {want}:")), "{said}");
    };
    let at = lines.iter().position(|l| l.contains("\"echo\"")).unwrap();
    let mut edited = lines.clone();
    edited[at] = edited[at].replace("\"echo\"", "\"ecko\"");
    check(&edited, at + 1);
    let mut removed = lines.clone();
    removed.remove(2);
    check(&removed, 3);
    let mut reordered = lines.clone();
    reordered.swap(0, 1);
    check(&reordered, 1);
    check(&lines[..lines.len() - 1], lines.len());
}

#[test]
fn an_audit_log_inside_the_workspace_is_refused_before_the_command_runs() {
    let d = dirs();
    let log = d.ws.join("audit.log");
    let log_s = log.to_str().unwrap();
    for args in [
        vec!["--audit", log_s, "--", "touch", "ran"],
        // A writable bind is the sandbox's as much as its workspace.
        vec![
            "--rw",
            d.outside.to_str().unwrap(),
            "--audit",
            d.outside.join("a.log").to_str().unwrap(),
            "--",
            "touch",
            "ran",
        ],
    ] {
        let out = run_in(&d.ws, &args);
        assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
        let said = text(&out.stderr);
        assert!(
            said.contains("refused") && said.contains("can write"),
            "{said}"
        );
    }
    assert!(!log.exists() && !d.outside.join("a.log").exists());
    assert!(!d.ws.join("ran").exists(), "the command ran");
    // Kept outside, the same run is recorded.
    let outside = d.outside.join("audit.log");
    let out = run_in(
        &d.ws,
        &["--audit", outside.to_str().unwrap(), "--", "touch", "ran"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(d.ws.join("ran").exists());
}

#[test]
fn an_audit_log_replaced_by_a_symlink_is_not_written_through() {
    let d = dirs();
    let log = d.outside.join("audit.log");
    let log_s = log.to_str().unwrap();
    let out = run_in(&d.ws, &["--audit", log_s, "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The log replaced by a link to a login script, then a command whose
    // text is shell to run at the next login.
    let profile = d.outside.join("bash_profile");
    std::fs::write(&profile, "# profile\n").unwrap();
    std::fs::remove_file(&log).unwrap();
    symlink(&profile, &log).unwrap();
    let out = run_in(
        &d.ws,
        &["--audit", log_s, "--", "echo", "$(id > pwned.txt)"],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("symbolic link"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&profile).unwrap(), "# profile\n");
    // A link to /dev/zero is refused at once, not read without bound.
    std::fs::remove_file(&log).unwrap();
    symlink("/dev/zero", &log).unwrap();
    let out = run_in(&d.ws, &["--audit", log_s, "--", "true"]);
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let out = hako().args(["audit", "verify"]).arg(&log).output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("longer than"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn an_audit_log_beneath_a_bind_mount_of_the_workspace_is_refused() {
    // The workspace reached under another path: a bind mount of it, made
    // in a mount namespace of this test's own.
    let d = dirs();
    let alias = d.outside.join("alias");
    std::fs::create_dir(&alias).unwrap();
    let script = "mount --bind \"$1\" \"$2\" || exit 99; exec \"$3\" run --workspace \"$1\" --audit \"$2/audit.log\" -- touch ran";
    let out = Command::new("unshare")
        .args(["--mount", "--map-root-user", "--propagation", "private"])
        .args(["sh", "-c", script, "sh"])
        .arg(&d.ws)
        .arg(&alias)
        .arg(env!("CARGO_BIN_EXE_hako"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    if out.status.code() == Some(99) {
        assert!(
            std::env::var_os("HAKO_MUST_WORK").is_none(),
            "cannot make a bind mount here: {}",
            text(&out.stderr)
        );
        eprintln!("SKIPPED: cannot make a bind mount here");
        return;
    }
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("can write"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.ws.join("ran").exists(), "the command ran");
    assert!(!d.ws.join("audit.log").exists());
}

/// `hako run` with `flags`: exit 2 (a usage error, before anything runs),
/// naming the flag.
fn refused_as_usage(flags: &[&str], named: &str, says: &str) {
    let d = dirs();
    let mut args: Vec<&str> = flags.to_vec();
    args.extend(["--", "true"]);
    let out = run_in(&d.ws, &args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
    assert!(stderr.contains(named), "{flags:?}: {stderr}");
    assert!(stderr.contains(says), "{flags:?}: {stderr}");
}

#[test]
fn a_memory_limit_of_one_byte_is_refused_naming_the_flag() {
    refused_as_usage(&["--memory", "1"], "--memory", "at least 16M");
}

#[test]
fn a_memory_limit_in_mb_is_refused_as_ambiguous() {
    refused_as_usage(&["--memory", "64MB"], "--memory", "ambiguous");
}

#[test]
fn a_pids_limit_of_zero_is_refused_naming_the_flag() {
    refused_as_usage(&["--pids", "0"], "--pids", "at least 16");
}

#[test]
fn every_limit_flag_out_of_range_or_malformed_is_a_usage_error_naming_it() {
    for (flags, named) in [
        (&["--cpus", "0"][..], "--cpus"),
        (&["--cpus", "half"][..], "--cpus"),
        (&["--max-open-files", "3"][..], "--max-open-files"),
        (&["--max-file-size", "0"][..], "--max-file-size"),
        (&["--max-output", "2G"][..], "--max-output"),
        (&["--timeout", "0"][..], "--timeout"),
        (&["--timeout", "2d"][..], "--timeout"),
        (&["--max-sessions", "0"][..], "--max-sessions"),
        (&["--max-processes=-1"][..], "--max-processes"),
        (&["--min-isolation", "strong"][..], "--min-isolation"),
    ] {
        refused_as_usage(flags, named, "");
    }
}

#[test]
fn a_bad_limit_in_a_profile_is_refused_naming_the_key_and_nothing_runs() {
    let d = dirs();
    let profile = d.outside.join("p.toml");
    std::fs::write(&profile, "memory = \"64MB\"\n").unwrap();
    let out = run_in(
        &d.ws,
        &[
            "--profile",
            profile.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "touch ran",
        ],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("profile key `memory`"), "{stderr}");
    assert!(!d.ws.join("ran").exists());
}

#[test]
fn hako_fs_edit_replaces_exact_text_and_refuses_an_ambiguous_match() {
    let d = dirs();
    std::fs::write(d.ws.join("c.py"), "x = 1\ny = 2\nx = 1\n").unwrap();
    let out = fs_in(
        &d.ws,
        &[
            "--backend",
            "host",
            "edit",
            "c.py",
            "--old",
            "x = 1",
            "--new",
            "x = 3",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("2 times"),
        "{}",
        text(&out.stderr)
    );
    let out = fs_in(
        &d.ws,
        &[
            "--backend",
            "host",
            "--json",
            "edit",
            "c.py",
            "--old",
            "x = 1",
            "--new",
            "x = 3",
            "--all",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("\"replacements\":2"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        std::fs::read_to_string(d.ws.join("c.py")).unwrap(),
        "x = 3\ny = 2\nx = 3\n"
    );
}

#[test]
fn min_isolation_from_a_profile_refuses_a_weaker_backend() {
    let d = dirs();
    let profile = d.outside.join("p.toml");
    std::fs::write(&profile, "min_isolation = \"kernel\"\n").unwrap();
    let out = run_in(
        &d.ws,
        &[
            "--profile",
            profile.to_str().unwrap(),
            "--backend",
            "host",
            "--",
            "sh",
            "-c",
            "touch ran",
        ],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("kernel"),
        "{}",
        text(&out.stderr)
    );
    assert!(!d.ws.join("ran").exists());
}

/// Starts `hako serve` with `args`, reads its stderr up to the line that
/// says it listens, stops it, and returns what it said.
fn serve_says(ws: &Path, args: &[&str]) -> String {
    use std::io::BufRead;
    let mut child = hako()
        .arg("serve")
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line.contains("listening on") {
            // The warnings about where it listens follow that line.
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(200));
    let _ = child.kill();
    for line in lines.map_while(Result::ok) {
        said.push_str(&line);
        said.push('\n');
    }
    let _ = child.wait();
    said
}

#[test]
fn hako_serve_on_the_host_backend_warns_unless_min_isolation_is_given() {
    let d = dirs();
    let said = serve_says(&d.ws, &["--backend", "host", "--listen", "127.0.0.1:0"]);
    assert!(
        said.contains("warning: the host backend isolates nothing"),
        "{said}"
    );
    assert!(!said.contains("beyond loopback"), "{said}");
}

#[test]
fn hako_serve_with_min_isolation_above_host_refuses_to_start() {
    let d = dirs();
    let out = hako()
        .args([
            "serve",
            "--backend",
            "host",
            "--min-isolation",
            "process",
            "--listen",
            "127.0.0.1:0",
            "--workspace",
        ])
        .arg(&d.ws)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(
        stderr.contains("`process`") && !stderr.contains("listening"),
        "{stderr}"
    );
}

#[test]
fn hako_serve_warns_about_a_token_file_open_to_others_and_a_listen_address_beyond_loopback() {
    use std::os::unix::fs::PermissionsExt;
    let d = dirs();
    let token = d.outside.join("token");
    std::fs::write(&token, "a-token-of-the-right-length").unwrap();
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).unwrap();
    let said = serve_says(
        &d.ws,
        &[
            "--backend",
            "host",
            "--min-isolation",
            "none",
            "--listen",
            "0.0.0.0:0",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    assert!(said.contains("open to group or others"), "{said}");
    assert!(said.contains("beyond loopback, over plain HTTP"), "{said}");
    // A token file of the user's alone, on loopback: no warning of either.
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    let said = serve_says(
        &d.ws,
        &[
            "--backend",
            "linux",
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            token.to_str().unwrap(),
        ],
    );
    assert!(!said.contains("warning"), "{said}");
}

#[test]
fn bench_load_opens_sandboxes_through_serve_runs_commands_in_each_and_closes_them_all() {
    // The load benchmark's whole code path at a small scale (no figure is
    // asserted: it is a benchmark; this checks that it works).
    let out = hako()
        .args(["bench", "--load", "--backend", "linux", "--sandboxes", "5"])
        .args([
            "--clients",
            "3",
            "--commands",
            "2",
            "--docker-containers",
            "0",
            "--json",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let hako = &v["hako"];
    assert_eq!(hako["opened"], 5, "{v}");
    assert_eq!(hako["commands"], 10, "{v}");
    assert_eq!(hako["errors"], 0, "{v}");
    assert!(hako["pss_per_idle_mib"].as_f64().is_some(), "{v}");
    assert!(v["docker"].is_null(), "{v}");
}

#[test]
fn bench_cow_measures_the_write_jobs_and_a_diff_that_walks_only_what_changed() {
    // The copy-on-write benchmark's whole code path at a small scale (no
    // time is asserted: it is a benchmark; this checks that it works, and
    // what the review engine's scan looked at).
    let out = hako()
        .args([
            "bench",
            "--cow",
            "--cow-files",
            "100",
            "--diff-files",
            "1000",
        ])
        .args(["--iterations", "1", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    for figure in [
        "cow_write.ratio_vs_plain",
        "cow_copy_up.ratio_vs_plain",
        "cow_diff.ratio_vs_git_status",
        "cow_diff_process.ratio_vs_git_status",
    ] {
        let ratio = v["figures"]["linux"][figure].as_f64();
        assert!(ratio.is_some_and(|r| r > 0.0), "{figure} missing from {v}");
    }
    let cow = &v["cow"];
    assert_eq!(cow["files"], 100, "{v}");
    assert_eq!(cow["rewritten"], 10, "{v}");
    assert_eq!(cow["write_goal"], 1.15, "{v}");
    assert!(cow["write_meets_goal"].is_boolean(), "{v}");
    // Both sides saw the same 100 changes.
    assert_eq!(cow["changes_found"], 100, "{v}");
    assert_eq!(cow["git_status_lines"], 100, "{v}");
    // The 1,000 files are in 10 directories of 100 under one top one
    // (1,011 entries); the 100 changes are spread over all 10. The scan
    // looks at the 100 changed names and the 11 directories above them
    // in the upper layer, each looked up once in the workspace, and lists
    // no workspace directory: the size of the change, not of the
    // workspace.
    assert_eq!(
        cow["visited"],
        serde_json::json!({"upper_entries": 111, "lower_entries": 111, "lower_dirs_listed": 0}),
        "{v}"
    );
}

#[test]
fn an_audit_log_cut_mid_line_by_a_crash_is_named_and_the_next_run_goes_on() {
    let d = dirs();
    let log = d.outside.join("audit.log");
    let log_s = log.to_str().unwrap();
    let out = run_in(&d.ws, &["--audit", log_s, "--", "echo", "one"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // A crash of hako in the middle of writing a line: the file ends in
    // part of a record.
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.pop();
    let cut_at = bytes.len() - 15;
    bytes.truncate(cut_at);
    std::fs::write(&log, &bytes).unwrap();
    let kept = bytes.len() - bytes.iter().rposition(|&b| b == b'\n').unwrap() - 1;
    let out = run_in(&d.ws, &["--audit", log_s, "--", "echo", "two"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "two\n");
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("{kept} bytes of a record cut off by a crash")),
        "the run says what was cut: {err}"
    );
    let verify = hako().args(["audit", "verify"]).arg(&log).output().unwrap();
    let said = text(&verify.stdout);
    assert_eq!(verify.status.code(), Some(0), "{said}");
    assert!(said.contains("1 line cut by a crash"), "{said}");
    assert!(said.contains("damage: line"), "{said}");
    let show = hako().args(["audit", "show"]).arg(&log).output().unwrap();
    let shown = text(&show.stdout);
    assert_eq!(show.status.code(), Some(0), "{shown}");
    assert!(shown.contains("cut") && shown.contains("echo"), "{shown}");
}

#[test]
fn hako_out_of_file_descriptors_says_so_and_does_not_crash() {
    let d = dirs();
    for limit in ["8", "12"] {
        // `ulimit -n` lowers the hard limit too: hako cannot raise it.
        let out = Command::new("sh")
            .args([
                "-c",
                "ulimit -n \"$1\" && exec \"$2\" run --workspace \"$3\" -- echo hi",
                "sh",
                limit,
            ])
            .arg(env!("CARGO_BIN_EXE_hako"))
            .arg(&d.ws)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "limit {limit}: {err}");
        assert!(
            err.contains("too few file descriptors left")
                && err.contains(&format!("its limit is {limit}")),
            "limit {limit}: the error names the cause: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // And with room, the same command runs.
    let out = run_in(&d.ws, &["--", "echo", "hi"]);
    assert_eq!(text(&out.stdout), "hi\n", "{}", text(&out.stderr));
}

/// `hako run` of a command the memory limit kills: exit code 137, a line
/// on stderr that names `--memory`, and `oom_killed` in `--json`; a plain
/// `kill -9` says nothing of memory. (Under 32M: the killed command is a
/// child this test binary waits for, through hako, and
/// `json_flood_is_truncated_and_hako_stays_small` bounds the largest.)
#[test]
fn hako_run_says_a_command_over_the_memory_limit_was_killed_for_memory() {
    let d = dirs();
    let dd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"];
    let mut args = vec!["--backend", "linux", "--memory", "32M", "--"];
    args.extend(dd);
    let out = run_in(&d.ws, &args);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("memory limit") && stderr.contains("--memory"),
        "{stderr}"
    );
    let mut json = vec!["--backend", "linux", "--memory", "32M", "--json", "--"];
    json.extend(dd);
    let out = run_in(&d.ws, &json);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["oom_killed"].as_bool(), v["signal"].as_i64()),
        (Some(true), Some(9)),
        "{v}"
    );
    let out = run_in(
        &d.ws,
        &[
            "--backend",
            "linux",
            "--memory",
            "32M",
            "--",
            "sh",
            "-c",
            "kill -9 $$",
        ],
    );
    assert_eq!(out.status.code(), Some(137));
    assert!(
        !text(&out.stderr).contains("memory"),
        "{}",
        text(&out.stderr)
    );
}
