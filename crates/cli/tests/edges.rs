//! The rough edges a new user met at the command line, each tested through
//! the `hako` binary: URLs in `--allow`, profile keys and their values,
//! the help text of every command, and `run --json` errors.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn hako() -> Command {
    Command::new(env!("CARGO_BIN_EXE_hako"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
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

#[test]
fn allow_takes_a_url_as_its_host_and_the_port_of_its_scheme() {
    let tmp = tempfile::tempdir().unwrap();
    // A host service on loopback, allowed by a URL: the sandbox reaches it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"from-the-host\n").unwrap();
    });
    let allow = format!("http://localhost:{port}/");
    let script = format!("busybox nc 127.0.0.1 {port} </dev/null");
    let out = run_in(
        tmp.path(),
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
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    assert!(
        json["stdout"].as_str().unwrap().contains("from-the-host"),
        "{json}"
    );
    assert_eq!(json["network_access"], "allowlist", "{json}");

    // A URL with a path is refused before anything runs, saying that
    // entries are hosts, and what to write instead.
    let out = run_in(
        tmp.path(),
        &[
            "--backend",
            "linux",
            "--allow",
            "https://example.org/some/repo",
            "--",
            "true",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains("`https://example.org/some/repo`")
            && err.contains("allow entries are hosts, not URLs with a path")
            && err.contains("write `https://example.org`"),
        "{err}"
    );
    assert!(!err.contains("not a port number"), "{err}");
    // A scheme with no known port is refused by name.
    let out = run_in(
        tmp.path(),
        &[
            "--backend",
            "linux",
            "--allow",
            "ftp://example.org",
            "--",
            "true",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("`ftp://` is not a scheme"), "{err}");
}

#[test]
fn profile_min_isolation_timeout_and_audit_apply_and_bad_values_list_the_valid_ones() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let profile = tmp.path().join("p.toml");
    std::fs::write(
        &profile,
        "backend = \"linux\"\nmin_isolation = \"process\"\ntimeout = \"1s\"\naudit = \"logs.jsonl\"\n",
    )
    .unwrap();
    let p = profile.to_str().unwrap();
    // The profile's timeout ends the command; its audit log records it.
    let out = run_in(&ws, &["--profile", p, "--json", "--", "sleep", "30"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", text(&out.stdout), text(&out.stderr)));
    assert_eq!(json["timed_out"], true, "{json}");
    assert_eq!(json["backend"], "linux", "{json}");
    let log = tmp.path().join("logs.jsonl");
    assert!(hako_audit_verifies(&log), "{}", log.display());
    let records = std::fs::read_to_string(&log).unwrap();
    assert!(
        records.contains("\"sleep\"") && records.contains("\"timed_out\":true"),
        "{records}"
    );
    // A flag wins over the key: --timeout lets the command finish.
    let out = run_in(
        &ws,
        &[
            "--profile",
            p,
            "--timeout",
            "60s",
            "--json",
            "--",
            "echo",
            "done",
        ],
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (json["timed_out"].clone(), json["exit_code"].clone()),
        (false.into(), 0.into()),
        "{json}"
    );
    // The profile's min_isolation refuses a weaker backend.
    let out = run_in(&ws, &["--profile", p, "--backend", "host", "--", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("process"), "{err}");

    for (key, valid) in [
        (
            "backend = \"dockr\"",
            "auto, host, linux, landlock, docker, gvisor",
        ),
        ("net = \"open\"", "none, allow or host"),
        ("min_isolation = \"strong\"", "none, process, kernel, vm"),
        ("timeout = \"soon\"", "30s"),
        ("audti = \"x.log\"", "`audit`"),
    ] {
        std::fs::write(&profile, format!("{key}\n")).unwrap();
        let out = run_in(&ws, &["--profile", p, "--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{key}: {err}");
        assert!(err.contains(valid), "{key}: {err}");
    }
}

/// `hako audit verify FILE` accepts the log.
fn hako_audit_verifies(log: &Path) -> bool {
    hako()
        .args(["audit", "verify"])
        .arg(log)
        .output()
        .unwrap()
        .status
        .success()
}

fn help(args: &[&str]) -> String {
    let out = hako().args(args).output().unwrap();
    assert!(out.status.success(), "hako {args:?}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// What `-h` says of `flag`: its line and the lines that continue it.
fn short_help_line(help: &str, flag: &str) -> Option<String> {
    let with_value = format!("{flag} <");
    let mut lines = help.lines();
    let first = lines.find(|l| l.trim_start().starts_with(&with_value))?;
    let rest = lines.take_while(|l| !l.trim_start().starts_with('-') && !l.trim().is_empty());
    Some(
        std::iter::once(first)
            .chain(rest)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

#[test]
fn help_lists_the_values_of_every_enum_flag() {
    let enums: [(&str, &[&str]); 3] = [
        (
            "--backend",
            &[
                "auto", "host", "linux", "landlock", "docker", "gvisor", "vm",
            ],
        ),
        ("--min-isolation", &["none", "process", "kernel", "vm"]),
        ("--net", &["none", "allow", "host"]),
    ];
    for command in ["run", "shell", "fs", "mcp", "serve", "doctor", "bench"] {
        let short = help(&[command, "-h"]);
        let long = help(&[command, "--help"]);
        for (flag, values) in enums {
            let Some(line) = short_help_line(&short, flag) else {
                continue;
            };
            let listed = format!("[possible values: {}]", values.join(", "));
            assert!(line.contains(&listed), "hako {command} -h, {flag}:\n{line}");
            // --help describes each value on a line of its own.
            for value in values {
                assert!(
                    long.contains(&format!("- {value}:")),
                    "hako {command} --help does not describe {flag} {value}:\n{long}"
                );
            }
            // A bad value is refused, listing the valid ones.
            let args = [command, flag, "bogus"];
            let out = hako().args(args).output().unwrap();
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "hako {args:?}: {err}");
            assert!(
                err.contains("invalid value 'bogus'") && err.contains(&listed),
                "hako {args:?}: {err}"
            );
        }
    }
    // Every command that opens a sandbox has the three; doctor has none.
    for command in ["run", "shell", "mcp", "serve"] {
        let short = help(&[command, "-h"]);
        for (flag, _) in enums {
            assert!(
                short_help_line(&short, flag).is_some(),
                "hako {command} -h lacks {flag}"
            );
        }
    }
    let doctor = help(&["doctor", "--help"]);
    assert!(
        doctor.contains("--json") && !doctor.contains(" <"),
        "{doctor}"
    );
}

#[test]
fn fs_help_offers_only_the_flags_that_apply_to_files() {
    let fs = help(&["fs", "--help"]);
    for absent in [
        "--memory",
        "--pids",
        "--cpus",
        "--max-file-size",
        "--max-open-files",
        "--max-output",
        "--max-sessions",
        "--max-processes",
        "--net",
        "--allow",
        "--resolve",
        "--timeout",
        "--env",
        "--pass-env",
        "--ro",
        "--rw",
        "--best-effort",
    ] {
        assert!(
            !fs.lines()
                .any(|l| l.trim_start().starts_with(&format!("{absent} ")) || l.trim() == absent),
            "hako fs --help offers {absent}:\n{fs}"
        );
    }
    for present in [
        "--profile <FILE>",
        "--backend <BACKEND>",
        "--workspace <DIR>",
        "--min-isolation <LEVEL>",
        "--cow",
        "--name <NAME>",
        "--json",
    ] {
        assert!(
            fs.contains(present),
            "hako fs --help lacks {present}:\n{fs}"
        );
    }
    // Such a flag is a usage error, not silently ignored.
    let tmp = tempfile::tempdir().unwrap();
    let out = hako()
        .args(["fs", "--memory", "1G", "--workspace"])
        .arg(tmp.path())
        .arg("ls")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("unexpected argument '--memory'"));
    // What it keeps still works: a file written and listed.
    let mut child = hako()
        .args([
            "fs",
            "--backend",
            "linux",
            "--min-isolation",
            "process",
            "--workspace",
        ])
        .arg(tmp.path())
        .args(["write", "a.txt"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hi\n").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("a.txt")).unwrap(),
        "hi\n"
    );
    // And a profile's keys for commands are still read and checked.
    let profile = tmp.path().join("p.toml");
    std::fs::write(&profile, "memory = \"lots\"\n").unwrap();
    let out = hako()
        .args(["fs", "--profile"])
        .arg(&profile)
        .arg("--workspace")
        .arg(tmp.path())
        .arg("ls")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("profile key `memory`"));
}

#[test]
fn run_json_errors_carry_the_backend_and_its_isolation_like_results() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let json_of = |args: &[&str]| -> (serde_json::Value, Option<i32>) {
        let out = run_in(&ws, args);
        let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("{args:?}: {e}: {}{}", text(&out.stdout), text(&out.stderr))
        });
        (v, out.status.code())
    };
    // A result, for comparison.
    let (ok, code) = json_of(&["--backend", "linux", "--json", "--", "true"]);
    assert_eq!(code, Some(0), "{ok}");
    assert_eq!(
        (ok["backend"].as_str(), ok["isolation"].as_str()),
        (Some("linux"), Some("process"))
    );

    for (args, code, backend, isolation, says) in [
        // A command that is not there.
        (
            &["--backend", "linux", "--json", "--", "no-such-command-here"][..],
            127,
            "linux",
            "process",
            "command not found",
        ),
        // A cwd outside the workspace.
        (
            &[
                "--backend",
                "linux",
                "--cwd",
                "../x",
                "--json",
                "--",
                "true",
            ][..],
            125,
            "linux",
            "process",
            "climbs out",
        ),
        // A policy that refuses the backend.
        (
            &[
                "--backend",
                "host",
                "--min-isolation",
                "process",
                "--json",
                "--",
                "true",
            ][..],
            125,
            "host",
            "none",
            "requires isolation `process`",
        ),
        // A network mode the backend cannot enforce.
        (
            &["--backend", "host", "--net", "none", "--json", "--", "true"][..],
            125,
            "host",
            "none",
            "cannot provide network mode `none`",
        ),
    ] {
        let (v, got) = json_of(args);
        assert_eq!(got, Some(code), "{args:?}: {v}");
        assert_eq!(v["exit_code"], code, "{args:?}: {v}");
        assert_eq!(v["backend"], backend, "{args:?}: {v}");
        assert_eq!(v["isolation"], isolation, "{args:?}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{args:?}: {v}");
    }

    // Before a backend is chosen (a profile that does not parse), both are
    // there, and null.
    let profile = tmp.path().join("p.toml");
    std::fs::write(&profile, "backend = \"dockr\"\n").unwrap();
    let (v, code) = json_of(&[
        "--profile",
        profile.to_str().unwrap(),
        "--json",
        "--",
        "true",
    ]);
    assert_eq!(code, Some(125), "{v}");
    let obj = v.as_object().unwrap();
    assert!(
        obj["backend"].is_null() && obj["isolation"].is_null(),
        "{v}"
    );
    assert!(v["error"].as_str().unwrap().contains("dockr"), "{v}");
}
