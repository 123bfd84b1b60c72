//! What the tests of `hako_sys` that run their case in a child process
//! share: the child prints one `PREFIX key=value` line per probe, the
//! parent reads them back; a case that cannot run here is skipped with
//! the reason, or fails when `HAKO_MUST_WORK=1`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::Output;

/// Child: prints one probe's result.
pub fn emit(prefix: &str, key: &str, value: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{prefix}{key}={value}").unwrap();
    out.flush().unwrap();
}

/// Parent: the `key=value` lines a child printed, after checking that it
/// exited 0.
pub fn results(prefix: &str, out: &Output) -> HashMap<String, String> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {:?}\n--- stdout\n{stdout}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let r = parse(prefix, &stdout);
    let mut sorted: Vec<_> = r.iter().collect();
    sorted.sort();
    eprintln!("child results: {sorted:?}");
    r
}

/// The `key=value` lines of `stdout` that start with `prefix`.
pub fn parse(prefix: &str, stdout: &str) -> HashMap<String, String> {
    stdout
        .lines()
        // libtest may have printed "test <name> ... " on the same line.
        .filter_map(|l| l.find(prefix).map(|i| &l[i + prefix.len()..]))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Prints why a case is skipped; with `HAKO_MUST_WORK=1`, fails instead.
pub fn skip(reason: &str) {
    if std::env::var("HAKO_MUST_WORK").as_deref() == Ok("1") {
        panic!("HAKO_MUST_WORK=1 and this case cannot run: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// A directory `hako-{tag}-PID-NANOS` under the system temp dir, removed
/// on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let path = std::env::temp_dir().join(format!("hako-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir(&path).unwrap();
        Self(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
