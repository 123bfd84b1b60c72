//! Text from inside a sandbox must not reach the user's terminal as
//! instructions: names, symlink targets, logged commands and the error
//! lines that quote them are printed with their controls escaped (an OSC 0
//! title, a screen clear, an OSC 52 clipboard write, a forged `hako: ...`
//! line), while the `--json` outputs keep the text as it is.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::Stdio;

use super::{dirs, fs_in, hako, run_in, text};

/// Sets a window title.
const OSC_TITLE: &str = "\x1b]0;pwned\x07";
/// Clears the screen and homes the cursor.
const CLEAR: &str = "\x1b[2J\x1b[H";
/// Writes "echo pwned" to the clipboard.
const OSC52: &str = "\x1b]52;c;ZWNobyBwd25lZA==\x07";
/// Starts a line of its own that hako never printed.
const FORGED: &str = "\r\nhako: all clear";

/// The characters in `out` that a terminal would obey or that would break
/// or reorder a line (every control but the newline ending a line, the C1
/// controls, the bidi controls); a byte that is not UTF-8 counts as one.
fn live_controls(out: &[u8]) -> Vec<char> {
    String::from_utf8_lossy(out)
        .chars()
        .filter(|&c| {
            c != '\n'
                && (c.is_control()
                    || c == '\u{fffd}'
                    || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'))
        })
        .collect()
}

/// Runs `script` with `sh -c` inside a sandbox on `ws`.
fn inside(ws: &Path, script: &str) {
    let out = run_in(ws, &["--", "sh", "-c", script]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

/// `text` as the shell's `printf` format writes it (octal escapes).
fn printf_format(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        match b {
            b' '..=b'~' if b != b'\\' && b != b'\'' && b != b'%' => out.push(char::from(b)),
            _ => out.push_str(&format!("\\{b:03o}")),
        }
    }
    out
}

#[test]
fn a_file_name_with_terminal_escapes_is_shown_escaped_by_fs_ls() {
    let d = dirs();
    let names = [
        format!("a{OSC_TITLE}"),
        format!("b{CLEAR}"),
        format!("c{OSC52}"),
        format!("d{FORGED}"),
        // CSI as one C1 character, and "gpj.exe" behind a right-to-left
        // override (it displays as "exe.jpg").
        "e\u{9b}2J".to_string(),
        "f\u{202e}gpj.exe".to_string(),
    ];
    let mut script = String::new();
    for name in &names {
        script.push_str(&format!("touch \"$(printf '{}')\"\n", printf_format(name)));
    }
    // A name that is not UTF-8: a C1 CSI as a lone Latin-1 byte.
    script.push_str("touch \"$(printf 'g\\233')\"\n");
    inside(&d.ws, &script);

    let out = fs_in(&d.ws, &["ls"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(live_controls(&out.stdout), [] as [char; 0], "{shown:?}");
    // One line per entry: no name forged one.
    assert_eq!(shown.lines().count(), names.len() + 1, "{shown}");
    for want in [
        "a\\x1b]0;pwned\\x07",
        "b\\x1b[2J\\x1b[H",
        "c\\x1b]52;c;ZWNobyBwd25lZA==\\x07",
        "d\\r\\nhako: all clear",
        "e\\u{9b}2J",
        "f\\u{202e}gpj.exe",
        "g\\x9b",
    ] {
        assert!(
            shown.lines().any(|l| l.ends_with(&format!(" {want}"))),
            "{want} not in\n{shown}"
        );
    }

    // --json keeps every name as it is (JSON escapes its controls).
    let out = fs_in(&d.ws, &["--json", "ls"], b"");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let listed: Vec<&str> = v["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    for name in &names {
        assert!(
            listed.contains(&name.as_str()),
            "{name:?} not in {listed:?}"
        );
    }
    assert!(listed.contains(&"g\u{fffd}"), "{listed:?}");
}

#[test]
fn a_symlink_target_with_an_osc52_clipboard_write_is_shown_escaped_by_fs_stat() {
    let d = dirs();
    let target = format!("{OSC52}{CLEAR}{OSC_TITLE}{FORGED}");
    inside(
        &d.ws,
        &format!("ln -s \"$(printf '{}')\" link", printf_format(&target)),
    );

    let out = fs_in(&d.ws, &["stat", "link"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(live_controls(&out.stdout), [] as [char; 0], "{shown:?}");
    // kind, size, mode, mtime, links, target: nothing more.
    assert_eq!(shown.lines().count(), 6, "{shown}");
    assert_eq!(
        shown.lines().last(),
        Some(
            "target: \\x1b]52;c;ZWNobyBwd25lZA==\\x07\\x1b[2J\\x1b[H\\x1b]0;pwned\\x07\\r\\nhako: all clear"
        ),
        "{shown}"
    );

    let out = fs_in(&d.ws, &["--json", "stat", "link"], b"");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["symlink_target"], target.as_str());
}

#[test]
fn a_name_with_escapes_in_the_truncation_note_of_fs_read_is_shown_escaped() {
    let d = dirs();
    let name = format!("n{OSC_TITLE}{FORGED}");
    inside(
        &d.ws,
        &format!("printf hello > \"$(printf '{}')\"", printf_format(&name)),
    );

    let out = fs_in(&d.ws, &["read", &name, "--max-bytes", "1"], b"");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "h");
    let said = text(&out.stderr);
    assert_eq!(live_controls(&out.stderr), [] as [char; 0], "{said:?}");
    assert_eq!(
        said,
        "hako: n\\x1b]0;pwned\\x07\\r\\nhako: all clear truncated at 1 bytes (--max-bytes)\n"
    );
}

#[test]
fn a_profile_key_with_escapes_cannot_forge_lines_in_the_error_hako_run_prints() {
    let d = dirs();
    // A profile written inside the sandbox whose unknown key the error
    // quotes as it is.
    inside(
        &d.ws,
        r#"printf '"\\u001b]0;pwned\\u0007\\r\\nhako: all clear" = 1\n' > p.toml"#,
    );
    let profile = d.ws.join("p.toml");
    let out = run_in(
        &d.ws,
        &["--profile", profile.to_str().unwrap(), "--", "true"],
    );
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let said = text(&out.stderr);
    assert_eq!(live_controls(&out.stderr), [] as [char; 0], "{said:?}");
    assert_eq!(said.lines().count(), 1, "{said}");
    assert!(
        said.contains("unknown field `\\x1b]0;pwned\\x07\\r\\nhako: all clear`"),
        "{said}"
    );

    // --json carries the message as it is.
    let out = run_in(
        &d.ws,
        &[
            "--json",
            "--profile",
            profile.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let error = v["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("unknown field `{OSC_TITLE}{FORGED}`")),
        "{error:?}"
    );
}

/// Whether `hako mcp` can start its guest here; prints why not.
pub(crate) fn guest_ready() -> bool {
    let guest = Path::new(env!("CARGO_BIN_EXE_hako")).with_file_name("hako-guest");
    if std::env::var_os("HAKO_GUEST").is_some() || guest.is_file() {
        return true;
    }
    let reason = format!(
        "{} is missing; run `cargo build --workspace` first",
        guest.display()
    );
    assert!(
        std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
        "{reason} and HAKO_MUST_WORK=1"
    );
    eprintln!("SKIPPED: {reason}");
    false
}

/// Calls `run_command` once with `command` through `hako mcp` on stdio,
/// which records it in `log`.
fn run_command_over_mcp(ws: &Path, log: &Path, command: &str) {
    let mut server = hako()
        .arg("mcp")
        .arg("--workspace")
        .arg(ws)
        .arg("--audit")
        .arg(log)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut to = server.stdin.take().unwrap();
    let mut from = BufReader::new(server.stdout.take().unwrap());
    let mut send = |message: serde_json::Value| {
        writeln!(to, "{message}").unwrap();
        to.flush().unwrap();
    };
    let mut reply = |id: u64| loop {
        let mut line = String::new();
        assert_ne!(from.read_line(&mut line).unwrap(), 0, "hako mcp ended");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        if v["id"] == id {
            return v;
        }
    };
    send(serde_json::json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "hako-tests", "version": "0"},
        },
    }));
    reply(1);
    send(serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    send(serde_json::json!({
        "jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "run_command", "arguments": {"command": command}},
    }));
    let v = reply(2);
    assert!(v["result"]["content"].is_array(), "{v}");
    drop(to);
    assert!(server.wait().unwrap().success());
}

/// The records of `log` as `hako audit show --json` prints them, checked
/// against the file.
fn records_shown_as_json(log: &Path) -> Vec<serde_json::Value> {
    let out = hako()
        .args(["audit", "show", "--json"])
        .arg(log)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let written: Vec<serde_json::Value> = std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(shown, written);
    shown
}

#[test]
fn a_command_with_escapes_and_newlines_cannot_forge_lines_in_audit_show() {
    if !guest_ready() {
        return;
    }
    let d = dirs();
    let log = d.outside.join("audit.log");
    // A record of its own, as `audit show` would print the next one.
    let forged = "\n   99  2026-01-01 00:00:00.000  exec     command=ls";
    let command = format!("true {OSC_TITLE}{CLEAR}{OSC52}\r{forged}");
    run_command_over_mcp(&d.ws, &log, &command);

    let out = hako().args(["audit", "show"]).arg(&log).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(live_controls(&out.stdout), [] as [char; 0], "{shown:?}");
    let records = records_shown_as_json(&log);
    assert_eq!(shown.lines().count(), records.len(), "{shown}");
    assert!(!shown.lines().any(|l| l.starts_with("   99 ")), "{shown}");
    let escaped = "command=true \\x1b]0;pwned\\x07\\x1b[2J\\x1b[H\\x1b]52;c;ZWNobyBwd25lZA==\\x07\\r\\n   99  2026-01-01 00:00:00.000  exec     command=ls";
    assert!(shown.contains(escaped), "{shown}");
    // The log itself, and --json, keep the command as it was run.
    assert!(
        records.iter().any(|r| r["command"] == command.as_str()),
        "{records:?}"
    );
}

#[test]
fn a_c1_csi_or_a_bidi_override_in_a_logged_argv_is_shown_escaped_by_audit_show() {
    let d = dirs();
    let log = d.outside.join("audit.log");
    // JSON leaves the C1 and bidi controls as they are; `audit show`
    // prints an argv as JSON.
    let arg = "x\u{9b}2J\u{9d}0;pwned\u{9c}\u{202e}gpj.exe\u{7f}";
    let out = run_in(
        &d.ws,
        &["--audit", log.to_str().unwrap(), "--", "echo", arg],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    let out = hako().args(["audit", "show"]).arg(&log).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert_eq!(live_controls(&out.stdout), [] as [char; 0], "{shown:?}");
    let records = records_shown_as_json(&log);
    assert_eq!(shown.lines().count(), records.len(), "{shown}");
    let escaped = r#"argv=["echo","x\u009b2J\u009d0;pwned\u009c\u202egpj.exe\u007f"]"#;
    assert!(shown.contains(escaped), "{shown}");
    assert!(records.iter().any(|r| r["argv"][1] == arg), "{records:?}");
}
