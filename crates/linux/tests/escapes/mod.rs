//! Escape attempts from inside a linux sandbox. Each test is named after the
//! attack and asserts it is refused, and that nothing on the host changed.

use std::io::Read;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::workspace;
use hako_core::{Command, ExitStatus, Output, Sandbox};
use hako_linux::{Limits, LinuxConfig, LinuxSandbox};

fn sandbox(ws: &Path) -> LinuxSandbox {
    LinuxSandbox::new(LinuxConfig::new(ws)).unwrap()
}

fn limited(ws: &Path, limits: Limits) -> LinuxSandbox {
    let mut config = LinuxConfig::new(ws);
    config.spec.limits = limits;
    LinuxSandbox::new(config).unwrap()
}

fn sh(sb: &dyn Sandbox, script: &str) -> Output {
    sb.exec(&Command::shell(script).timeout(Duration::from_secs(60)))
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn reading_etc_shadow_is_refused() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(&sb, "cat /etc/shadow; cat /etc/gshadow; ls /etc/sudoers.d");
    // Masked: /dev/null (empty) or an empty directory; nothing of the host's.
    assert_eq!(text(&out.stdout), "");
    if let Ok(host) = std::fs::read_to_string("/etc/shadow") {
        assert!(!host.is_empty() || out.stdout.is_empty());
    }
}

#[test]
fn reading_a_file_in_the_host_home_is_refused() {
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()));
    let marker = home.join(format!(".hako-escape-test-{}", std::process::id()));
    if std::fs::write(&marker, "HOME-SECRET").is_err() {
        eprintln!("SKIPPED: cannot write into {}", home.display());
        assert!(
            std::env::var("HAKO_MUST_WORK").is_err(),
            "HAKO_MUST_WORK=1 and no writable home directory to plant a secret in"
        );
        return;
    }
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(
        &sb,
        &format!("cat {} 2>&1; ls {} 2>&1", marker.display(), home.display()),
    );
    std::fs::remove_file(&marker).unwrap();
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("HOME-SECRET"), "{stdout}");
    // The home's path may be the sandbox's own home there: private and
    // empty, never the host's directory.
    let cat_failed = stdout.lines().next().unwrap_or("");
    assert!(cat_failed.contains("No such file"), "{stdout}");
    assert_eq!(
        stdout.lines().count(),
        1,
        "the home lists something: {stdout}"
    );
}

#[test]
fn writing_outside_the_workspace_into_etc_or_usr_is_refused() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let name = format!("hako-escape-{}", std::process::id());
    for dir in ["/etc", "/usr", "/usr/bin", "/", "/proc", "/dev"] {
        let path = format!("{dir}/{name}");
        let out = sh(&sb, &format!("echo x > {path}"));
        assert!(!out.status.success(), "{path} was writable");
        assert!(!Path::new(&path).exists(), "{path} appeared on the host");
    }
    // And the workspace is writable.
    let out = sh(&sb, "echo ok > inside && cat inside");
    assert_eq!(text(&out.stdout), "ok\n");
}

#[test]
fn seeing_or_signalling_a_host_process_is_refused() {
    let mut host = std::process::Command::new("sleep")
        .arg("120")
        .spawn()
        .unwrap();
    let pid = host.id();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(
        &sb,
        &format!("ls /proc/{pid} >/dev/null 2>&1 && echo seen; kill -0 {pid} 2>/dev/null && echo signalled; kill -9 {pid} 2>/dev/null; ls /proc | grep -c '^[0-9]'"),
    );
    let stdout = text(&out.stdout);
    assert!(
        !stdout.contains("seen") && !stdout.contains("signalled"),
        "{stdout}"
    );
    // Only the sandbox's own processes are visible: its pid 1, this
    // command's supervisor, sh, ls and grep.
    let visible: u32 = stdout.trim().parse().unwrap();
    assert!(visible <= 6, "{visible} processes visible");
    assert!(host.try_wait().unwrap().is_none(), "the host process died");
    host.kill().unwrap();
    host.wait().unwrap();
}

#[test]
fn reaching_a_service_on_the_host_loopback_is_refused() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(
        &sb,
        &format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' 2>&1 && echo connected"),
    );
    assert!(
        !text(&out.stdout).contains("connected"),
        "{}",
        text(&out.stdout)
    );
    // Nothing arrived.
    assert!(listener.accept().is_err());
    // Loopback inside works: a listener inside the sandbox is reachable.
    let out = sh(
        &sb,
        "python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\", 0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"loopback ok\")' 2>&1 || echo no-python",
    );
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("loopback ok") || stdout.contains("no-python"),
        "{stdout}"
    );
}

#[test]
fn a_secret_host_variable_is_not_visible_in_env_or_proc_1_environ() {
    std::env::set_var("HAKO_ESCAPE_TEST_API_TOKEN", "leaked-token");
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(&sb, "env; cat /proc/1/environ 2>&1; cat /proc/self/environ");
    assert!(!text(&out.stdout).contains("leaked-token"));
}

#[test]
fn proc_self_status_shows_no_capability_and_no_new_privs_and_seccomp() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(&sb, "grep -E '^(Cap|NoNewPrivs|Seccomp)' /proc/self/status");
    let status = text(&out.stdout);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{cap}:\t0000000000000000")),
            "{cap}: {status}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    // Pid 1 keeps capabilities in the sandbox's namespace: the filter holds
    // it too, and exactly one filter is stacked on a command.
    let pid1 = text(&sh(&sb, "grep -E '^Seccomp' /proc/1/status").stdout);
    assert!(pid1.contains("Seccomp:\t2"), "pid 1: {pid1}");
    assert!(status.contains("Seccomp_filters:\t1"), "{status}");
}

#[test]
fn a_fork_bomb_under_pids_128_is_contained() {
    let (_d, ws) = workspace();
    let sb = limited(
        &ws,
        Limits {
            pids: Some(128),
            ..Limits::default()
        },
    );
    // A bounded bomb: try to start 1000 sleepers, recording (with shell
    // builtins only, which need no fork) how many started. Without the limit
    // all 1000 start (and are killed when the command ends).
    let out = sh(
        &sb,
        "n=0; while [ $n -lt 1000 ]; do sleep 30 & n=$((n+1)); echo $n > started; done",
    );
    let started: u32 = std::fs::read_to_string(ws.join("started"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        (1..=128).contains(&started),
        "{started} processes started: {}",
        text(&out.stderr)
    );
    assert!(text(&out.stderr).contains("fork"), "{}", text(&out.stderr));
}

/// The limit stops the command that reaches it (forks fail inside, the
/// shell reports it), and the same sandbox runs the next command.
#[test]
fn two_hundred_background_processes_under_pids_128_fail_inside_and_the_sandbox_goes_on() {
    let (_d, ws) = workspace();
    let sb = limited(
        &ws,
        Limits {
            pids: Some(128),
            ..Limits::default()
        },
    );
    let out = sh(
        &sb,
        "n=0; while [ $n -lt 200 ]; do sleep 30 & n=$((n+1)); echo $n > started; done; echo all-started",
    );
    let started: u32 = std::fs::read_to_string(ws.join("started"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let stderr = text(&out.stderr);
    assert!((1..128).contains(&started), "{started} started: {stderr}");
    assert!(!text(&out.stdout).contains("all-started"), "{stderr}");
    assert!(stderr.contains("fork"), "{stderr}");
    let out = sh(&sb, "echo again | cat; sleep 0 & wait; echo done");
    assert_eq!(text(&out.stdout), "again\ndone\n", "{}", text(&out.stderr));
}

/// A low limit leaves room for the guest's own processes.
#[test]
fn a_sandbox_under_pids_40_runs_echo_ok() {
    let (_d, ws) = workspace();
    let sb = limited(
        &ws,
        Limits {
            pids: Some(40),
            ..Limits::default()
        },
    );
    let out = sh(&sb, "for i in 1 2 3 4 5; do sleep 0 & done; wait; echo ok");
    assert_eq!(text(&out.stdout), "ok\n", "{}", text(&out.stderr));
}

/// Open files, a file's size and processes, each hit in turn: only the
/// command that hit it fails; a session and a long-lived process go on.
#[test]
fn limits_hit_inside_end_only_the_command_that_hit_them() {
    let (_d, ws) = workspace();
    let sb = limited(&ws, hako_conformance::limits::limits());
    hako_conformance::limits::each_limit_hit_inside_ends_only_that_command(&sb, &ws).unwrap();
}

#[test]
fn a_1_gib_allocation_under_memory_256m_fails() {
    let (_d, ws) = workspace();
    let sb = limited(
        &ws,
        Limits {
            memory: Some(256 << 20),
            ..Limits::default()
        },
    );
    // dd allocates its whole block size up front.
    let out = sh(
        &sb,
        "dd if=/dev/zero of=/dev/null bs=1G count=1 2>&1 && echo survived; echo done",
    );
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("survived"), "{stdout}");
    assert!(stdout.contains("done"));
}

/// A sandbox under `--memory 64M`, or `None` (with the reason printed as
/// a skip of `name`) where the memory limit is an address-space rlimit:
/// without a cgroup (an unprivileged caller on cgroup v1) nothing kills
/// for memory, an allocation fails instead.
fn under_memory_64m(ws: &Path, name: &str) -> Option<LinuxSandbox> {
    let sb = limited(
        ws,
        Limits {
            memory: Some(hako_conformance::memory::LIMIT),
            ..Limits::default()
        },
    );
    let by_cgroup = sb.capabilities().limits.iter().any(|l| {
        l.kind == hako_core::LimitKind::Memory
            && matches!(
                l.mechanism,
                hako_core::LimitMechanism::CgroupV1 | hako_core::LimitMechanism::CgroupV2
            )
    });
    if by_cgroup {
        return Some(sb);
    }
    let reason = "the memory limit is an rlimit here (no cgroup for this user)";
    assert!(!hako_conformance::must_work(), "{name}: {reason}");
    eprintln!("SKIPPED {name}: {reason}");
    None
}

#[test]
fn a_command_over_the_memory_limit_is_reported_killed_for_memory_and_the_sandbox_goes_on() {
    let (_d, ws) = workspace();
    let name =
        "a_command_over_the_memory_limit_is_reported_killed_for_memory_and_the_sandbox_goes_on";
    let Some(sb) = under_memory_64m(&ws, name) else {
        return;
    };
    hako_conformance::memory::a_command_over_the_memory_limit_is_reported_killed_for_memory_and_the_sandbox_goes_on(&sb).unwrap();
}

#[test]
fn a_plain_kill_9_under_a_memory_limit_is_not_reported_as_memory() {
    let (_d, ws) = workspace();
    let sb = limited(
        &ws,
        Limits {
            memory: Some(hako_conformance::memory::LIMIT),
            ..Limits::default()
        },
    );
    hako_conformance::memory::a_plain_kill_9_is_not_reported_as_memory(&sb).unwrap();
}

#[test]
fn a_50_mb_file_under_max_file_size_10m_is_cut() {
    let (_d, ws) = workspace();
    let sb = limited(
        &ws,
        Limits {
            file_size: Some(10 << 20),
            ..Limits::default()
        },
    );
    let out = sh(&sb, "head -c 50000000 /dev/zero > big; echo $?");
    let code: i32 = text(&out.stdout).trim().parse().unwrap();
    assert_ne!(code, 0);
    let size = std::fs::metadata(ws.join("big")).unwrap().len();
    assert!(size <= 10 << 20, "{size}");
}

/// The command lines of host processes that contain `marker`.
fn host_processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let mut cmdline = String::new();
        if let Ok(mut f) = std::fs::File::open(entry.path().join("cmdline")) {
            let _ = f.read_to_string(&mut cmdline);
        }
        if cmdline.contains(marker) {
            found.push(cmdline);
        }
    }
    found
}

#[test]
fn a_setsid_background_process_does_not_survive_the_run() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let marker = format!("{}", 50_000_000 + std::process::id());
    let out = sh(&sb, &format!("setsid sleep {marker} & echo started"));
    assert_eq!(text(&out.stdout), "started\n");
    let left = host_processes_with(&marker);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn starving_the_supervisor_of_descriptors_to_outlive_the_deadline_is_refused() {
    // With no descriptor left, the supervisor could not list what to kill;
    // a setsid'd child would then outlive the command's deadline.
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let marker = format!("{}", 51_000_000 + std::process::id());
    let script = format!(
        "prlimit --pid $PPID --nofile=0:0 && echo supervisor-starved; \
         prlimit --pid 1 --nofile=0:0 && echo pid1-starved; \
         prlimit --pid $$ --nofile=1000:1000 && echo self-by-pid; \
         setsid sleep {marker} & sleep 60"
    );
    let out = sb
        .exec(&Command::shell(&script).timeout(std::time::Duration::from_secs(3)))
        .unwrap();
    assert!(out.timed_out, "{out:?}");
    let stdout = text(&out.stdout);
    assert!(
        !stdout.contains("starved"),
        "{stdout} {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("Operation not permitted"),
        "{}",
        text(&out.stderr)
    );
    // Its own limits by pid 0 stay settable (setrlimit is prlimit64(0, ...)).
    let own = sh(&sb, "ulimit -n 100 && ulimit -n");
    assert_eq!(text(&own.stdout), "100\n", "{}", text(&own.stderr));
    let left = host_processes_with(&marker);
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn changing_the_host_hostname_is_refused() {
    let before = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let out = sh(
        &sb,
        "hostname evil-hako 2>&1; echo evil > /proc/sys/kernel/hostname 2>&1; hostname",
    );
    assert_eq!(text(&out.stdout).lines().last(), Some("hako"));
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap(),
        before
    );
    assert_eq!(out.status, ExitStatus::Code(0));
}

/// `hako-probe`: `$HAKO_PROBE`, else where Cargo puts binaries beside the
/// test binary's directory.
fn probe_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("HAKO_PROBE") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().unwrap();
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("hako-probe"))
        .find(|p| p.is_file())
        .expect("hako-probe not built: run cargo build --workspace --bins or set HAKO_PROBE")
}

#[test]
fn every_system_call_the_policy_refuses_gets_eperm_inside_the_sandbox() {
    let (_d, ws) = workspace();
    std::fs::copy(probe_binary(), ws.join("hako-probe")).unwrap();
    let sb = sandbox(&ws);
    let out = sb
        .exec(&Command::new(["./hako-probe"]).timeout(Duration::from_secs(120)))
        .unwrap();
    assert_eq!(out.status, ExitStatus::Code(0), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let syscalls = report["syscalls"].as_object().unwrap();
    assert!(syscalls.len() >= 40, "only {} checks", syscalls.len());
    let mut allowed = Vec::new();
    for (check, result) in syscalls {
        if result["policy"] != "allow" && result["refused"] != true {
            allowed.push(format!("{check}: {result}"));
        }
    }
    assert!(allowed.is_empty(), "not refused inside: {allowed:#?}");
    let status = &report["status"];
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status[cap], "0000000000000000", "{cap}");
    }
    assert_eq!(status["NoNewPrivs"], "1");
    assert_eq!(status["Seccomp"], "2");
    assert_eq!(report["hostname"], "hako");
    assert_ne!(report["euid"], 0);
}

/// Landlock, not only the read-only view: procfs is mounted writable (a
/// process may rewrite its own entries there on the host), and Landlock
/// allows writes only beneath the workspace, /tmp and a few devices, so
/// rewriting /proc/self/comm is refused inside. The ruleset is built once by
/// pid 1 and handed to each command's supervisor by descriptor.
#[test]
fn rewriting_the_sandbox_processes_own_proc_entries_is_refused() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    let script = "for i in 1 2 3; do (echo hacked > /proc/self/comm) 2>/dev/null && echo WROTE; done; cat /proc/self/comm";
    let out = sh(&sb, script);
    let shown = text(&out.stdout);
    assert!(!shown.contains("WROTE"), "{shown}");
    assert!(!shown.contains("hacked"), "{shown}");
    // The same through a session's shell.
    let s = hako_core::Sandbox::sessions(&sb).unwrap();
    let id = s
        .open_session(&hako_core::SessionOptions::default())
        .unwrap();
    let out = s
        .session_exec(id, &hako_core::Command::shell(script), None)
        .unwrap();
    assert!(
        !text(&out.stdout).contains("WROTE"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn writing_a_frame_on_the_guests_link_through_proc_is_refused() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    if let Err(message) = hako_conformance::attacks::writing_on_the_guests_link_through_proc(&sb) {
        panic!("{message}");
    }
}

#[test]
fn stealing_the_guests_link_from_a_fresh_supervisor_is_refused() {
    let (_d, ws) = workspace();
    std::fs::copy(probe_binary(), ws.join("hako-probe")).unwrap();
    let sb = sandbox(&ws);
    if let Err(message) =
        hako_conformance::attacks::stealing_the_guests_link_from_a_fresh_supervisor(
            &sb,
            "./hako-probe",
            10,
        )
    {
        panic!("{message}");
    }
}

#[test]
fn stealing_the_guests_link_while_a_terminal_is_typed_at_is_refused() {
    // A fresh sandbox for each try: the guest forks its terminal probe
    // once per sandbox, and a try whose probe caught nothing tried nothing.
    for attempt in 1..=3 {
        let (_d, ws) = workspace();
        std::fs::copy(probe_binary(), ws.join("hako-probe")).unwrap();
        let sb = sandbox(&ws);
        match hako_conformance::attacks::stealing_the_guests_link_while_a_terminal_is_typed_at(
            &sb,
            "./hako-probe",
        ) {
            Ok(()) => return,
            Err(message)
                if message.starts_with(hako_conformance::attacks::FORKED_NOTHING)
                    && attempt < 3 => {}
            Err(message) => panic!("{message}"),
        }
    }
}

/// Ctrl-D at the start of a line ends a canonical-mode reader on a
/// terminal (the kernel delivers end of file; the guest does nothing).
#[test]
fn ctrl_d_ends_cat_on_a_terminal() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    assert!(
        hako_conformance::terminal::ctrl_d_ends_cat(&sb, Duration::from_secs(30)).unwrap(),
        "Ctrl-D did not end cat"
    );
    let out = sh(&sb, "echo ok");
    assert_eq!(text(&out.stdout), "ok\n");
}

/// Ctrl-C and Ctrl-\ at an interactive job-control shell end its
/// foreground job (the kernel signals it) and the shell prompts again.
#[test]
fn ctrl_c_and_ctrl_backslash_interrupt_the_foreground_job_of_an_interactive_shell() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    for typed in [b"\x03", b"\x1c"] {
        assert!(
            hako_conformance::terminal::a_control_byte_interrupts_the_foreground_job_of_an_interactive_shell(&sb, typed, 100).unwrap(),
            "{typed:?} did not interrupt the foreground job"
        );
    }
    let out = sh(&sb, "echo ok");
    assert_eq!(text(&out.stdout), "ok\n");
}

/// Ctrl-Z at an interactive job-control shell stops its foreground job
/// and the shell prompts again; the stopped job ends with the shell.
#[test]
fn ctrl_z_stops_the_foreground_job_of_an_interactive_shell() {
    let (_d, ws) = workspace();
    let sb = sandbox(&ws);
    assert!(
        hako_conformance::terminal::ctrl_z_stops_the_foreground_job_of_an_interactive_shell(
            &sb, 100
        )
        .unwrap(),
        "Ctrl-Z did not stop the foreground job"
    );
    let out = sh(&sb, "echo ok");
    assert_eq!(text(&out.stdout), "ok\n");
}
