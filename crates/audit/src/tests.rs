//! The audit log's unit tests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn append(log: &AuditLog, kind: &str, v: Value) -> Result<(), AuditError> {
    match v {
        Value::Object(map) => log.append(kind, map),
        _ => log.append(kind, Map::new()),
    }
}

/// A closed log of five records (four and `end`), and its lines.
fn log() -> (tempfile::TempDir, PathBuf, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let log = AuditLog::open(&path, &[]).unwrap();
    for i in 0..4 {
        append(
            &log,
            "exec",
            serde_json::json!({"argv": ["echo", i], "exit_code": 0}),
        )
        .unwrap();
    }
    drop(log);
    let lines = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    (dir, path, lines)
}

fn write(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    std::fs::write(path, text).unwrap();
}

fn broken_at(path: &Path) -> (u64, String) {
    match verify(path) {
        Err(AuditError::Broken { line, reason, .. }) => (line, reason),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_sound_log_verifies_and_continues_after_reopening() {
    let (_dir, path, lines) = log();
    assert_eq!(lines.len(), 5);
    let v = verify(&path).unwrap();
    assert_eq!((v.records, v.closed), (5, true));
    let log = AuditLog::open(&path, &[]).unwrap();
    append(&log, "write", serde_json::json!({"path": "a", "size": 1})).unwrap();
    drop(log);
    let v2 = verify(&path).unwrap();
    assert_eq!(v2.records, 7);
    assert_ne!(v.head, v2.head);
}

#[test]
fn a_typed_record_is_one_line_of_the_chain_and_reads_back_with_its_kind() {
    let (_dir, path, _) = log();
    let log = AuditLog::open(&path, &[]).unwrap();
    let mut failure = Failure::new(FrontEnd::Serve, "outside the workspace");
    failure.path = Some("../x".into());
    log.write(&failure.record(true)).unwrap();
    log.write(&Record::NetDropped { dropped: 2 }).unwrap();
    drop(log);
    // The lines written before (ad-hoc JSON, as old logs hold) and the
    // typed ones verify as one chain.
    assert_eq!(verify(&path).unwrap().records, 8);
    let records = records(&path).unwrap();
    assert_eq!(records[5]["kind"], "refusal");
    assert_eq!(records[5]["front_end"], "serve");
    assert_eq!(records[5]["path"], "../x");
    assert_eq!(records[6]["kind"], "net");
    assert_eq!(records[6]["dropped"], 2);
}

#[test]
fn an_edited_line_is_named() {
    let (_dir, path, mut lines) = log();
    lines[2] = lines[2].replace("\"exit_code\":0", "\"exit_code\":1");
    write(&path, &lines);
    let (line, reason) = broken_at(&path);
    assert_eq!(line, 3, "{reason}");
    assert!(reason.contains("edited"), "{reason}");
    // Reopening a tampered log for appending is refused.
    assert!(matches!(
        AuditLog::open(&path, &[]),
        Err(AuditError::Broken { line: 3, .. })
    ));
}

#[test]
fn an_edited_line_with_its_hash_recomputed_breaks_the_next_link() {
    let (_dir, path, mut lines) = log();
    let mut obj: Map<String, Value> = serde_json::from_str(&lines[1]).unwrap();
    obj.insert("exit_code".into(), Value::from(7));
    let hash = record_hash(&obj);
    obj.insert("hash".into(), Value::from(hash));
    lines[1] = Value::Object(obj).to_string();
    write(&path, &lines);
    assert_eq!(broken_at(&path).0, 3);
}

#[test]
fn a_removed_line_is_named() {
    let (_dir, path, mut lines) = log();
    lines.remove(1);
    write(&path, &lines);
    let (line, reason) = broken_at(&path);
    assert_eq!(line, 2, "{reason}");
    assert!(reason.contains("seq"), "{reason}");
}

#[test]
fn reordered_lines_are_named() {
    let (_dir, path, mut lines) = log();
    lines.swap(1, 2);
    write(&path, &lines);
    assert_eq!(broken_at(&path).0, 2);
}

#[test]
fn a_truncated_log_is_named() {
    let (_dir, path, lines) = log();
    // Cut in the middle of the last line.
    let mut text = lines.join("\n");
    text.truncate(text.len() - 10);
    std::fs::write(&path, text).unwrap();
    let (line, reason) = broken_at(&path);
    assert_eq!(line, 5, "{reason}");
    // Whole lines cut off the end: no closing record.
    write(&path, &lines[..3]);
    let (line, reason) = broken_at(&path);
    assert_eq!(line, 4, "{reason}");
    assert!(reason.contains("closing record"), "{reason}");
}

#[test]
fn a_line_that_is_not_a_record_is_named() {
    let (_dir, path, mut lines) = log();
    lines.insert(2, "not json".into());
    write(&path, &lines);
    assert_eq!(broken_at(&path).0, 3);
}

fn refusal(result: Result<AuditLog, AuditError>) -> String {
    match result {
        Err(AuditError::Refused { reason, .. }) => reason,
        other => panic!("not refused: {other:?}"),
    }
}

#[test]
fn a_log_replaced_by_a_symlink_to_a_file_outside_is_refused() {
    let (dir, path, _) = log();
    let outside = dir.path().join("bash_profile");
    std::fs::write(&outside, "echo hi\n").unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&outside, &path).unwrap();
    let reason = refusal(AuditLog::open(&path, &[]));
    assert!(reason.contains("symbolic link"), "{reason}");
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "echo hi\n");
    // A dangling link is not followed to create its target either.
    let target = dir.path().join("created");
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&target, &path).unwrap();
    refusal(AuditLog::open(&path, &[]));
    assert!(!target.exists());
}

#[test]
fn a_log_beneath_a_directory_the_sandbox_can_write_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("project");
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    let writable = [ws.clone()];
    for path in [
        ws.join("audit.log"),
        ws.join("sub/audit.log"),
        ws.join("sub/../audit.log"),
    ] {
        let reason = refusal(AuditLog::open(&path, &writable));
        assert!(reason.contains("can write"), "{reason}");
        assert!(!path.exists(), "{}", path.display());
    }
    // Reached through a link from outside, it is the same place.
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&ws, &link).unwrap();
    refusal(AuditLog::open(&link.join("audit.log"), &writable));
    // The writable directory named through a link is resolved too.
    let log = dir.path().join("audit.log");
    refusal(AuditLog::open(&ws.join("a.log"), &[link]));
    // Beside the workspace is fine.
    AuditLog::open(&log, &writable).unwrap();
}

#[test]
fn a_log_replaced_by_a_link_to_dev_zero_is_refused_without_reading_it() {
    let (_dir, path, _) = log();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
    refusal(AuditLog::open(&path, &[]));
    // Verifying it (a reader follows the link) stops at the bound.
    match verify(&path) {
        Err(AuditError::Broken {
            line: 1, reason, ..
        }) => {
            assert!(reason.contains("longer than"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_fifo_as_the_log_is_refused_without_waiting_for_a_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let made = std::process::Command::new("mkfifo")
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    let reason = refusal(AuditLog::open(&path, &[]));
    assert!(reason.contains("regular file"), "{reason}");
}

#[test]
fn a_log_hard_linked_to_another_file_is_refused() {
    let (dir, path, _) = log();
    let other = dir.path().join("other.log");
    std::fs::hard_link(&path, &other).unwrap();
    let reason = refusal(AuditLog::open(&path, &[]));
    assert!(reason.contains("2 links"), "{reason}");
}

#[test]
fn a_log_planted_by_another_user_is_refused() {
    if !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var_os("HAKO_MUST_WORK").is_none(),
            "needs root to plant a file of another user"
        );
        eprintln!("SKIPPED a_log_planted_by_another_user_is_refused: needs root");
        return;
    }
    let (_dir, path, _) = log();
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let reason = refusal(AuditLog::open(&path, &[]));
    assert!(reason.contains("owned by uid 65534"), "{reason}");
}

#[test]
fn a_record_longer_than_the_line_bound_is_kept_as_a_digest_and_the_log_verifies() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("audit.log");
    let log = AuditLog::open(&path, &[]).unwrap();
    let huge = "x".repeat(MAX_LINE + 10);
    append(&log, "exec", serde_json::json!({"argv": [huge]})).unwrap();
    append(&log, "exec", serde_json::json!({"argv": ["true"]})).unwrap();
    drop(log);
    let v = verify(&path).unwrap();
    assert_eq!(v.records, 3);
    let records = records(&path).unwrap();
    assert!(
        records[0].contains_key("oversized_sha256"),
        "{:?}",
        records[0]
    );
    assert!(!records[0].contains_key("argv"));
    assert_eq!(records[1]["argv"][0], "true");
    // And it is continued after reopening.
    AuditLog::open(&path, &[]).unwrap();
}

/// The first four records of `log()` (its writer killed before `end`)
/// and `cut` bytes of the fifth: what a crash mid-write leaves.
fn cut_log(cut: usize, newline: bool) -> (tempfile::TempDir, PathBuf, Vec<String>) {
    let (dir, path, lines) = log();
    let mut text = lines[..4].join("\n");
    text.push('\n');
    text.push_str(&lines[4][..cut]);
    if newline {
        text.push('\n');
    }
    std::fs::write(&path, text).unwrap();
    (dir, path, lines)
}

#[test]
fn an_audit_log_cut_mid_line_by_a_crash_is_continued_after_a_record_that_names_the_cut() {
    let (_dir, path, lines) = cut_log(20, false);
    // Before it is reopened the cut is named, not accepted.
    let (line, reason) = broken_at(&path);
    assert_eq!(line, 5, "{reason}");
    assert!(reason.contains("cut off"), "{reason}");
    let log = AuditLog::open(&path, &[]).unwrap();
    let cut = log.repaired().cloned().expect("the open names the cut");
    assert_eq!(
        cut,
        Cut {
            line: 5,
            bytes: 20,
            sha256: sha256_hex(&lines[4].as_bytes()[..20]),
            after_seq: 4,
        }
    );
    assert!(cut.to_string().contains("20 bytes"), "{cut}");
    append(&log, "exec", serde_json::json!({"argv": ["true"]})).unwrap();
    drop(log);
    // The cut bytes are still there, on their own line, and the chain
    // verifies, reporting the damage.
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().nth(4), Some(&lines[4][..20]));
    let v = verify(&path).unwrap();
    assert_eq!(v.records, 7, "four, the cut, the new one and end");
    assert_eq!(v.cuts, vec![cut.clone()]);
    let records = records(&path).unwrap();
    assert_eq!(records[4]["kind"], CUT);
    assert_eq!(records[4]["cut_bytes"], 20);
    assert_eq!(records[4]["seq"], 5);
    assert_eq!(records[5]["argv"][0], "true");
    // Reopened again: nothing more to repair, the cut stays reported.
    let log = AuditLog::open(&path, &[]).unwrap();
    assert_eq!(log.repaired(), None);
    drop(log);
    assert_eq!(verify(&path).unwrap().cuts, vec![cut]);
}

#[test]
fn an_audit_log_cut_inside_a_character_is_repaired_the_same() {
    let (dir, path, lines) = log();
    let mut text = lines[..4].join("\n").into_bytes();
    text.extend_from_slice(b"\n{\"seq\":5,\"argv\":[\"\xc3");
    std::fs::write(&path, &text).unwrap();
    let log = AuditLog::open(&path, &[]).unwrap();
    assert_eq!(log.repaired().map(|c| c.bytes), Some(19));
    drop(log);
    assert_eq!(verify(&path).unwrap().cuts.len(), 1);
    drop(dir);
}

#[test]
fn an_audit_log_cut_just_before_a_newline_loses_nothing() {
    let (_dir, path, lines) = cut_log(lines_len(), false);
    let log = AuditLog::open(&path, &[]).unwrap();
    assert_eq!(log.repaired(), None);
    drop(log);
    let v = verify(&path).unwrap();
    assert_eq!((v.records, v.cuts.len()), (6, 0));
    assert_eq!(
        records(&path).unwrap()[4]["hash"].as_str(),
        {
            let obj: Map<String, Value> = serde_json::from_str(&lines[4]).unwrap();
            obj["hash"].as_str().map(str::to_string)
        }
        .as_deref()
    );
}

/// The length of `log()`'s fifth line (its `end`).
fn lines_len() -> usize {
    log().2[4].len()
}

#[test]
fn an_audit_log_cut_after_the_newline_of_a_cut_line_is_repaired() {
    // A crash between ending the cut line and writing its record.
    let (_dir, path, _) = cut_log(30, true);
    let log = AuditLog::open(&path, &[]).unwrap();
    assert_eq!(log.repaired().map(|c| (c.line, c.bytes)), Some((5, 30)));
    drop(log);
    let v = verify(&path).unwrap();
    assert_eq!(v.records, 6);
    assert_eq!(v.cuts.len(), 1);
}

#[test]
fn a_cut_record_that_does_not_name_the_bytes_before_it_is_refused() {
    let (_dir, path, _) = cut_log(20, false);
    drop(AuditLog::open(&path, &[]).unwrap());
    // Other bytes put in place of the cut ones: the cut record no
    // longer names them.
    let text = std::fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines[4] = "x".repeat(20);
    write(&path, &lines);
    let (line, reason) = broken_at(&path);
    assert_eq!(line, 5, "{reason}");
    assert!(AuditLog::open(&path, &[]).is_err());
    // And a line that is no record in the middle, with no cut record
    // after it, stays damage.
    lines.remove(5);
    write(&path, &lines);
    assert_eq!(broken_at(&path).0, 5);
}
