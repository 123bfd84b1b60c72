//! `hako diff`, `commit`, `discard` and `rm` on a named sandbox whose
//! upper layer is written here as a `--cow` run would leave it.

use std::path::PathBuf;
use std::process::Output;

use hako_layers::state::State;

use crate::hako;

struct Named {
    _tmp: tempfile::TempDir,
    ws: PathBuf,
    state: PathBuf,
    upper: PathBuf,
}

/// A workspace with `a.txt` and `b.txt`, and a sandbox `n` that edited
/// `a.txt`, deleted `b.txt` and made `c/new.txt`.
fn named() -> Named {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    std::fs::write(ws.join("b.txt"), "bee\n").unwrap();
    let state = tmp.path().join("state");
    let upper = State::create(&state, "n", &ws, &[]).unwrap().upper();
    std::fs::write(upper.join("a.txt"), "one\ntwo\n").unwrap();
    hako_sys::rustix::fs::mknodat(
        hako_sys::rustix::fs::CWD,
        upper.join("b.txt"),
        hako_sys::rustix::fs::FileType::CharacterDevice,
        hako_sys::rustix::fs::Mode::empty(),
        0,
    )
    .unwrap();
    std::fs::create_dir(upper.join("c")).unwrap();
    std::fs::write(upper.join("c/new.txt"), "new\n").unwrap();
    Named {
        _tmp: tmp,
        ws,
        state,
        upper,
    }
}

fn review(n: &Named, args: &[&str]) -> Output {
    hako()
        .args(&args[..1])
        .arg("--state")
        .arg(&n.state)
        .args(&args[1..])
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn hash_of(n: &Named) -> String {
    let out = review(n, &["diff", "n", "--hash"]);
    assert!(out.status.success(), "{out:?}");
    stdout(&out).trim().to_owned()
}

#[test]
fn diff_shows_every_change_and_ends_with_its_hash() {
    let n = named();
    let out = review(&n, &["diff", "n"]);
    assert!(out.status.success(), "{out:?}");
    let text = stdout(&out);
    assert!(
        text.contains(
            "diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1,2 @@\n one\n+two\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("deleted file mode 100644\n--- a/b.txt\n+++ /dev/null\n"),
        "{text}"
    );
    assert!(
        text.contains("new file mode 100644\n--- /dev/null\n+++ b/c/new.txt\n"),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("# hash: {}\n", hash_of(&n))),
        "{text}"
    );
    let stat = stdout(&review(&n, &["diff", "n", "--stat"]));
    assert!(
        stat.contains(" 4 changes, 2 insertions(+), 1 deletion(-)\n"),
        "{stat}"
    );
    let json: serde_json::Value =
        serde_json::from_slice(&review(&n, &["diff", "n", "--json"]).stdout).unwrap();
    assert_eq!(json["hash"], hash_of(&n));
    let paths: Vec<&str> = json["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["a.txt", "b.txt", "c", "c/new.txt"]);
    // The workspace is untouched by looking.
    assert_eq!(
        std::fs::read_to_string(n.ws.join("a.txt")).unwrap(),
        "one\n"
    );
}

#[test]
fn commit_with_the_reviewed_hash_applies_it_and_a_stale_one_is_refused() {
    let n = named();
    let reviewed = hash_of(&n);
    std::fs::write(n.upper.join("late.txt"), "slipped in\n").unwrap();
    let out = review(&n, &["commit", "n", "--expect", &reviewed]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not the ones reviewed"),
        "{out:?}"
    );
    assert!(!n.ws.join("late.txt").exists() && n.ws.join("b.txt").exists());
    // Reviewed again, committed, and recorded.
    let now = hash_of(&n);
    let log = n._tmp.path().join("audit.log");
    let log_arg = log.to_str().unwrap();
    let out = review(&n, &["commit", "n", "--expect", &now, "--audit", log_arg]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let rec = lines.iter().find(|r| r["kind"] == "review").unwrap();
    assert_eq!(
        (rec["op"].as_str(), rec["name"].as_str()),
        (Some("commit"), Some("n"))
    );
    assert_eq!(rec["diff_hash"], now.as_str());
    assert_eq!(rec["complete"], true);
    let a = rec["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "a.txt")
        .unwrap();
    assert_eq!(a["status"], "modified");
    assert_eq!(a["sha256"].as_str().unwrap().len(), 64);
    let verify = crate::hako()
        .args(["audit", "verify"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(verify.status.success(), "{verify:?}");
    let text = stdout(&out);
    assert!(
        text.contains("deleted b.txt\n") && text.contains("modified a.txt sha256:"),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(n.ws.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert!(!n.ws.join("b.txt").exists());
    assert_eq!(
        std::fs::read_to_string(n.ws.join("c/new.txt")).unwrap(),
        "new\n"
    );
    let out = review(&n, &["diff", "n", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["changes"].as_array().unwrap().len(), 0);
}

#[test]
fn commit_of_a_path_changed_in_the_workspace_is_refused_naming_it() {
    let n = named();
    std::fs::write(n.ws.join("a.txt"), "the person's edit\n").unwrap();
    let out = review(&n, &["commit", "n"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("a.txt"),
        "{out:?}"
    );
    assert!(n.ws.join("b.txt").exists());
    let out = review(&n, &["commit", "n", "c"]);
    assert!(out.status.success(), "{out:?}");
    assert!(n.ws.join("c/new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(n.ws.join("a.txt")).unwrap(),
        "the person's edit\n"
    );
}

#[test]
fn discard_of_a_path_then_rm_leaves_nothing() {
    let n = named();
    let out = review(&n, &["discard", "n", "a.txt"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "discarded a.txt\n");
    let text = stdout(&review(&n, &["diff", "n"]));
    assert!(!text.contains("a.txt") && text.contains("b.txt"), "{text}");
    assert_eq!(
        review(&n, &["discard", "n", "nothing"]).status.code(),
        Some(1)
    );
    let out = review(&n, &["rm", "n"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!n.state.join("n").exists());
    let out = review(&n, &["diff", "n"]);
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no sandbox named"),
        "{out:?}"
    );
    assert_eq!(
        std::fs::read_to_string(n.ws.join("a.txt")).unwrap(),
        "one\n"
    );
}

#[test]
fn a_bad_sandbox_name_is_refused() {
    let n = named();
    for name in ["../n", "a/b", "..", ".n"] {
        let out = review(&n, &["diff", name]);
        assert_eq!(out.status.code(), Some(125), "{name}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("invalid sandbox name"),
            "{out:?}"
        );
    }
}

/// `hako run --cow` with a private temporary directory for its
/// temporary layers.
fn run_cow(ws: &std::path::Path, tmp: &std::path::Path, args: &[&str]) -> Output {
    hako()
        .args(["run", "--backend", "linux", "--workspace"])
        .arg(ws)
        .arg("--cow")
        .args(args)
        .env("TMPDIR", tmp)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn run_cow_with_a_name_leaves_the_workspace_untouched_until_commit() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    let state = tmp.path().join("state");
    let private_tmp = tmp.path().join("tmp");
    std::fs::create_dir(&private_tmp).unwrap();
    let named = ["--name", "fix-1", "--state", state.to_str().unwrap(), "--"];
    let script = |s: &'static str| [&named[..], &["sh", "-c", s]].concat();
    let out = run_cow(
        &ws,
        &private_tmp,
        &script("echo two >> a.txt && echo new > b.txt && cat a.txt"),
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&out), "one\ntwo\n");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "one\n");
    assert!(!ws.join("b.txt").exists());
    // A second run continues on the layers, and may start in a
    // directory only they have.
    let out = run_cow(&ws, &private_tmp, &script("cat b.txt && mkdir sub"));
    assert_eq!(stdout(&out), "new\n", "{out:?}");
    let out = run_cow(
        &ws,
        &private_tmp,
        &[&["--cwd", "sub"][..], &script("pwd")].concat(),
    );
    assert_eq!(stdout(&out), format!("{}/sub\n", ws.display()), "{out:?}");
    let diff = hako()
        .args(["diff", "fix-1", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    let text = stdout(&diff);
    assert!(
        text.contains("+two\n") && text.contains("+++ b/b.txt\n"),
        "{text}"
    );
    let out = hako()
        .args(["commit", "fix-1", "--state"])
        .arg(&state)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "one\ntwo\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "new\n");
    // Without a name the layer is temporary: gone after the run.
    let out = run_cow(
        &ws,
        &private_tmp,
        &["--", "sh", "-c", "echo gone > c.txt && cat c.txt"],
    );
    assert_eq!(stdout(&out), "gone\n", "{out:?}");
    assert!(!ws.join("c.txt").exists());
    assert_eq!(std::fs::read_dir(&private_tmp).unwrap().count(), 0);
    // The host backend refuses --cow by name.
    let out = hako()
        .args(["run", "--backend", "host", "--workspace"])
        .arg(&ws)
        .args(["--cow", "--", "true"])
        .env("TMPDIR", &private_tmp)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--cow"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_dir(&private_tmp).unwrap().count(), 0);
}

#[test]
fn checkpoint_then_rollback_returns_the_sandbox_to_it_and_diff_compares_two() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(ws.join("a.txt"), "one\n").unwrap();
    let state = tmp.path().join("state");
    let private_tmp = tmp.path().join("tmp");
    std::fs::create_dir(&private_tmp).unwrap();
    let st = state.to_str().unwrap();
    let run = |s: &'static str| {
        run_cow(
            &ws,
            &private_tmp,
            &["--name", "cp", "--state", st, "--", "sh", "-c", s],
        )
    };
    let named = |args: &[&str]| {
        hako()
            .args(&args[..1])
            .args(["cp", "--state", st])
            .args(&args[1..])
            .output()
            .unwrap()
    };
    assert!(run("echo two >> a.txt").status.success());
    let out = named(&["checkpoint", "turn-1"]);
    assert_eq!(
        (out.status.code(), stdout(&out)),
        (Some(0), "1\n".into()),
        "{out:?}"
    );
    assert!(run("echo three >> a.txt && echo b > b.txt")
        .status
        .success());
    let out = named(&["diff", "--from", "turn-1", "--stat"]);
    let text = stdout(&out);
    assert!(
        text.contains(" a.txt | 1 +\n") && text.contains(" b.txt | 1 +\n"),
        "{text}"
    );
    assert!(text.contains(" 2 changes,"), "{text}");
    let log = tmp.path().join("audit.log");
    let out = named(&["rollback", "turn-1", "--audit", log.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stdout(&run("cat a.txt; ls")), "one\ntwo\na.txt\n");
    let rec = std::fs::read_to_string(&log).unwrap();
    assert!(
        rec.contains("\"op\":\"rollback\"") && rec.contains("\"checkpoint\":1"),
        "{rec}"
    );
    let out = named(&["checkpoint", "--list"]);
    assert!(stdout(&out).starts_with("1\tturn-1\t"), "{out:?}");
    let out = named(&["rollback", "nope"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(std::fs::read_to_string(ws.join("a.txt")).unwrap(), "one\n");
}

#[test]
fn a_writable_bind_holding_a_cow_workspace_is_refused_so_no_write_bypasses_the_layer() {
    // Bound read-write, the workspace's parent would show the real
    // workspace at its path, over the layered view: a write there (or to
    // the working directory) would land in the workspace itself.
    let tmp = tempfile::tempdir().unwrap();
    let parent = tmp.path().canonicalize().unwrap().join("parent");
    let ws = parent.join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let private_tmp = tmp.path().join("tmp");
    std::fs::create_dir(&private_tmp).unwrap();
    let script = format!("echo x > {}/f; echo y > g", ws.display());
    let out = run_cow(
        &ws,
        &private_tmp,
        &["--rw", parent.to_str().unwrap(), "--", "sh", "-c", &script],
    );
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("with --cow") && err.contains("parent"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&ws).unwrap().count(),
        0,
        "the workspace was written"
    );
    // The sandbox is usable with the bind beside the workspace.
    let beside = tmp.path().join("beside");
    std::fs::create_dir(&beside).unwrap();
    let out = run_cow(
        &ws,
        &private_tmp,
        &[
            "--rw",
            beside.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "echo y > g; cat g",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read_dir(&ws).unwrap().count(),
        0,
        "the workspace was written"
    );
}
