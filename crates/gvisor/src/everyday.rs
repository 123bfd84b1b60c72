//! Whether this host's `runsc` runs everyday tools, for `auto`'s choice
//! of backend.
//!
//! GNU coreutils' `ls -l` and `stat` (and so `ls -la`) call `statx` with
//! `AT_NO_AUTOMOUNT`. gVisor refused that flag with `EINVAL` until
//! release-20230227.0 (commit 7a0c4b5, "Ignore AT_NO_AUTOMOUNT flag in
//! statx() calls"), and the same flag to `newfstatat` until
//! release-20231030.0 (commit 2df63d7), so on an older `runsc` (Debian
//! bookworm's 0.0~20221219.0) `ls -la` prints `ls: cannot access '.':
//! Invalid argument`. Nothing in `runsc` or the bundle avoids it: no flag
//! of that release changes the check, and answering `statx` with `ENOSYS`
//! through the sandbox's seccomp policy only moves the failure, since
//! glibc's fallback passes the same flag to `newfstatat`.
//!
//! [`everyday_tools_work`] says whether `ls -la` and `stat` work on this
//! host's `runsc`. A release before the fix, by the date `runsc --version`
//! prints, is unfit without more ado. Any other (a later release, or a
//! build whose version names no date) is judged by a real probe
//! ([`probe_stat`]: the static guest's `--host-view --stat-probe`, run by
//! `runsc do`), which shows as well that `runsc` can start a sandbox here
//! at all: inside an unprivileged container it cannot (Docker's default
//! seccomp profile refuses it a user namespace, and the container's masked
//! `/proc` keeps it from mounting its own), and the answer says so.
//!
//! The answer is kept in hako's private directory ([`CACHE_FILE`]), keyed
//! by the identity of the `runsc` binary (real path, device, inode, size,
//! mtime and ctime) and, when the probe gave it, the guest's: `auto` pays
//! for it once per `runsc` (about 40 ms for `--version`, 300 ms with the
//! probe), then a `stat` and a small read per call. A probe that could not
//! start a sandbox answers that `runsc` is unfit, naming why, and is
//! believed for ten minutes; a check that failed before it cost anything
//! (no `runsc`, no guest, `--version` failing) is not kept.
//!
//! `newfstatat` with `AT_NO_AUTOMOUNT` still failing (releases 20230227 to
//! 20231023) does not make `runsc` unfit: GNU coreutils, Python, Go and
//! Rust's standard library do not pass it there; glibc's `statx` fallback
//! does, but only where `statx` itself is missing, which gVisor never is;
//! `mount(1)` does, and cannot mount in a sandbox anyway.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hako_container::{locate_static_guest, private};

use crate::host_view;
use crate::sandbox::runsc_path;
use crate::{NAME, RUNSC_VAR};

/// The first gVisor release whose `statx` takes `AT_NO_AUTOMOUNT`, as the
/// date in its name (release-20230227.0).
pub const STATX_FIXED: u32 = 20230227;

/// The first gVisor release whose `newfstatat` takes `AT_NO_AUTOMOUNT`
/// (release-20231030.0).
pub const FSTATAT_FIXED: u32 = 20231030;

/// The file, in hako's private directory, that keeps the answer.
pub const CACHE_FILE: &str = "gvisor-everyday-tools";

/// The first line of [`CACHE_FILE`]: its format.
const CACHE_FORMAT: &str = "hako gvisor everyday-tools 2";

/// Longest the cache file is read.
const CACHE_CAP: u64 = 16 * 1024;

/// How long `runsc --version` and the probe may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// `EINVAL`, as the probe reports it.
const EINVAL: i32 = 22;

/// Whether `ls -la` and `stat` work in a sandbox of this host's `runsc`
/// (`$HAKO_RUNSC`, else `runsc`), with the static guest `ready` finds:
/// `Err` is a one-line reason naming the `runsc`, its version and what
/// fails, for `auto` to pass over the `gvisor` backend and for `hako
/// doctor` to print. A check that cannot run, or a `runsc` that cannot
/// start a sandbox here, is an `Err` too. Cheap after the first call for
/// a given `runsc` binary (see the module's documentation); call it after
/// [`crate::ready`] succeeded.
pub fn everyday_tools_work() -> Result<(), String> {
    let runsc = runsc_path(None);
    let guest = locate_static_guest(NAME, None).ok();
    // Without a private directory the answer is worked out every time:
    // slower, never wrong.
    let dir = private::private_dir().ok();
    everyday_tools_work_with(&runsc, guest.as_deref(), dir.as_deref())
}

/// [`everyday_tools_work`] for the given `runsc` (a path, or a name looked
/// up in `PATH`), the static guest the probe runs (`None`: no probe can
/// run), and the directory the answer is kept in (`None`: not kept).
pub fn everyday_tools_work_with(
    runsc: &Path,
    guest: Option<&Path>,
    dir: Option<&Path>,
) -> Result<(), String> {
    let Some(binary) = resolve(runsc) else {
        return Err(format!(
            "{} is not found, so whether it runs everyday tools cannot be checked; install gVisor's runsc or set {RUNSC_VAR}",
            runsc.display()
        ));
    };
    let runsc_id = identity(&binary).map_err(|e| {
        format!(
            "cannot look at {} to check whether it runs everyday tools: {e}",
            binary.display()
        )
    })?;
    let guest_id = guest.and_then(|g| identity(g).ok());
    let cache = dir.map(|d| d.join(CACHE_FILE));
    if let Some(verdict) = cache
        .as_deref()
        .and_then(|c| read_cache(c, &runsc_id, guest_id.as_deref(), now()))
    {
        return verdict;
    }
    let (verdict, keep) = decide(&binary, guest);
    if let Some(cache) = &cache {
        let kept = match keep {
            Keep::Not => None,
            Keep::ByVersion => Some((None, None)),
            Keep::ByProbe => Some((guest_id.as_deref(), None)),
            Keep::ForAWhile => Some((guest_id.as_deref(), Some(now() + RETRY.as_secs()))),
        };
        if let Some((guest_key, until)) = kept {
            // A cache that cannot be written costs the next call the
            // check again, nothing more.
            let _ = write_cache(cache, &runsc_id, guest_key, until, &verdict);
        }
    }
    verdict
}

/// How long an answer is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keep {
    /// Not at all: the check failed before it cost anything.
    Not,
    /// For as long as the `runsc` binary is the same.
    ByVersion,
    /// For as long as the `runsc` binary and the guest are the same.
    ByProbe,
    /// The probe could not start a sandbox: for [`RETRY`], so that `auto`
    /// in a place where `runsc` cannot run pays for the attempt once in a
    /// while, not at every command, and a passing failure is not kept.
    ForAWhile,
}

/// How long a probe that could not run is believed.
const RETRY: Duration = Duration::from_secs(600);

/// Seconds since the epoch.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The answer and how long to keep it: a release before the fix is unfit
/// by its version alone; any other is judged by a probe run in it, which
/// also shows that `runsc` can start a sandbox here at all (it cannot
/// inside an unprivileged container, say).
fn decide(runsc: &Path, guest: Option<&Path>) -> (Result<(), String>, Keep) {
    let version = match runsc_version(runsc) {
        Ok(version) => version,
        Err(reason) => return (Err(reason), Keep::Not),
    };
    let date = release_date(&version);
    if let Some(date) = date.filter(|&d| d < STATX_FIXED) {
        return (verdict_by_date(runsc, &version, date), Keep::ByVersion);
    }
    let Some(guest) = guest else {
        return (
            Err(format!(
                "{} ({version}): with no static guest to probe it with, whether it runs everyday tools (`ls -la`, `stat`) cannot be checked",
                runsc.display()
            )),
            Keep::Not,
        );
    };
    let probe = tempfile::Builder::new()
        .prefix("hako-stat-probe-")
        .tempdir()
        .map_err(|e| format!("cannot make a directory to probe runsc in: {e}"))
        .and_then(|scratch| probe_stat(runsc, guest, scratch.path()));
    match probe {
        Ok(probe) => (verdict_by_probe(runsc, &version, probe), Keep::ByProbe),
        Err(e) => (
            Err(format!(
                "{} ({version}) cannot start a sandbox here, so whether it runs everyday tools cannot be checked: {e}{}",
                runsc.display(),
                container_hint()
            )),
            Keep::ForAWhile,
        ),
    }
}

/// Inside a container, what `runsc` needs of it (see the crate's README).
fn container_hint() -> &'static str {
    let inside = ["/.dockerenv", "/run/.containerenv"]
        .iter()
        .any(|p| Path::new(p).exists());
    if inside {
        "; inside a container, runsc needs the outer one run with --security-opt seccomp=unconfined --security-opt systempaths=unconfined (Docker's default seccomp profile refuses it the user namespace it runs in, and the container's masked /proc keeps it from mounting its own)"
    } else {
        ""
    }
}

/// The first line `runsc --version` prints (`runsc version
/// release-20231030.0`).
fn runsc_version(runsc: &Path) -> Result<String, String> {
    let scratch =
        tempfile::tempdir().map_err(|e| format!("cannot make a directory to run runsc in: {e}"))?;
    let mut command = Command::new(runsc);
    command.arg("--version");
    let out = run(command, scratch.path())
        .map_err(|e| format!("{} --version cannot run: {e}", runsc.display()))?;
    let first = out.stdout.lines().next().unwrap_or("").trim().to_string();
    if !out.success || first.is_empty() {
        return Err(format!(
            "{} --version failed ({}), so whether it runs everyday tools cannot be checked",
            runsc.display(),
            out.stderr.lines().last().unwrap_or("no output").trim()
        ));
    }
    Ok(first)
}

/// The release date in `runsc --version`'s first line, as `YYYYMMDD`:
/// upstream's `release-20231030.0`, Debian's `0.0~20221219.0`. `None`
/// when it names none (a build from a source tree).
pub fn release_date(version: &str) -> Option<u32> {
    let bytes = version.as_bytes();
    (0..bytes.len().saturating_sub(7)).find_map(|i| {
        let digits = bytes.get(i..i + 8)?;
        let bounded = (i == 0 || !bytes[i - 1].is_ascii_digit())
            && bytes.get(i + 8).is_none_or(|b| !b.is_ascii_digit());
        if !bounded || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let date: u32 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        let (year, month, day) = (date / 10000, date / 100 % 100, date % 100);
        ((2018..2100).contains(&year) && (1..=12).contains(&month) && (1..=31).contains(&day))
            .then_some(date)
    })
}

/// What fails, said once for both verdicts.
fn fails(runsc: &Path, version: &str, how: &str) -> String {
    format!(
        "{} ({version}) answers {how}, so GNU `ls -la` and `stat` fail inside it (`ls: cannot access '.': Invalid argument`); gVisor takes the flag from release-20230227.0 on: install a newer runsc or set {RUNSC_VAR} to one",
        runsc.display()
    )
}

/// The answer for a `runsc` of release `date` (see [`STATX_FIXED`]).
pub fn verdict_by_date(runsc: &Path, version: &str, date: u32) -> Result<(), String> {
    if date >= STATX_FIXED {
        return Ok(());
    }
    Err(fails(
        runsc,
        version,
        "statx and fstatat with AT_NO_AUTOMOUNT with EINVAL",
    ))
}

/// What [`probe_stat`] found: each call's errno, 0 when it succeeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatProbe {
    /// `statx(AT_FDCWD, "/", AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT, ...)`.
    pub statx: i32,
    /// `newfstatat` with the same flags.
    pub newfstatat: i32,
}

/// The answer [`probe_stat`]'s result gives: `statx` decides (see the
/// module's documentation for why `newfstatat` does not).
pub fn verdict_by_probe(runsc: &Path, version: &str, probe: StatProbe) -> Result<(), String> {
    match probe.statx {
        0 => Ok(()),
        EINVAL => Err(fails(
            runsc,
            version,
            &match probe.newfstatat {
                EINVAL => {
                    "statx and fstatat with AT_NO_AUTOMOUNT with EINVAL, as a probe run in it found"
                        .to_string()
                }
                0 => "statx with AT_NO_AUTOMOUNT with EINVAL (fstatat takes the flag), as a probe run in it found".to_string(),
                e => format!("statx with AT_NO_AUTOMOUNT with EINVAL (fstatat with errno {e}), as a probe run in it found"),
            },
        )),
        errno => Err(fails(
            runsc,
            version,
            &format!("statx with AT_NO_AUTOMOUNT with errno {errno}, as a probe run in it found"),
        )),
    }
}

/// Runs the static `guest`'s `--host-view --stat-probe` inside gVisor
/// (`runsc do`, with no network and no cgroups; `--rootless` without
/// root), its state under `scratch`, and reads what `statx` and
/// `newfstatat` returned there. `Err` when it could not run (a guest
/// without the mode among the reasons).
pub fn probe_stat(runsc: &Path, guest: &Path, scratch: &Path) -> Result<StatProbe, String> {
    let state = scratch.join("state");
    std::fs::create_dir(&state).map_err(|e| format!("cannot make {}: {e}", state.display()))?;
    let mut command = Command::new(runsc);
    command
        .arg("--root")
        .arg(&state)
        .args(["--network=none", "--ignore-cgroups"]);
    if !hako_sys::rustix::process::geteuid().is_root() {
        command.arg("--rootless");
    }
    command
        .arg("do")
        .arg(guest)
        .args([host_view::FLAG, host_view::STAT_PROBE]);
    let out = run(command, scratch).map_err(|e| format!("runsc do cannot run: {e}"))?;
    match host_view::parse_stat_probe(&out.stdout) {
        Some((statx, newfstatat)) => Ok(StatProbe { statx, newfstatat }),
        None => Err(format!(
            "runsc do {} {} {} {}: {}",
            guest.display(),
            host_view::FLAG,
            host_view::STAT_PROBE,
            if out.success {
                "printed no answer (a static guest older than this hako?)"
            } else {
                "failed"
            },
            out.stderr.lines().last().unwrap_or("no output").trim()
        )),
    }
}

/// What a command printed.
struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Runs `command` in `/` with no input, its output going to files in
/// `scratch` (`runsc`'s sandbox and gofer inherit them, and a pipe would
/// stay open while either lingers), killed after [`DEADLINE`]. Its input
/// is an empty file of `scratch`'s too, never `/dev/null`: `runsc` hands
/// the files of a sandbox's standard streams to the sandbox's user by
/// changing their owner, which for `/dev/null` would be the host's own
/// (as root, to `nobody`).
fn run(mut command: Command, scratch: &Path) -> std::io::Result<Output> {
    let (in_path, out_path, err_path) = (
        scratch.join("stdin"),
        scratch.join("stdout"),
        scratch.join("stderr"),
    );
    std::fs::File::create(&in_path)?;
    let mut child = command
        .current_dir("/")
        .stdin(std::fs::File::open(&in_path)?)
        .stdout(std::fs::File::create(&out_path)?)
        .stderr(std::fs::File::create(&err_path)?)
        .spawn()?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer after {} s", DEADLINE.as_secs()),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let read = |path: &Path| {
        std::fs::read(path)
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    };
    Ok(Output {
        success: status.success(),
        stdout: read(&out_path),
        stderr: read(&err_path),
    })
}

/// `runsc` as a path: itself when it names a directory, else the first
/// executable of that name in `PATH`.
fn resolve(runsc: &Path) -> Option<PathBuf> {
    if runsc.components().count() > 1 {
        return runsc.is_file().then(|| runsc.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(runsc))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
        })
}

/// A file's identity: its real path and what changes when it is replaced
/// or rewritten.
fn identity(path: &Path) -> std::io::Result<String> {
    let real = path.canonicalize()?;
    let m = std::fs::metadata(&real)?;
    Ok(format!(
        "{} dev={} ino={} size={} mtime={}.{} ctime={}.{}",
        real.display(),
        m.dev(),
        m.ino(),
        m.size(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    ))
}

/// The kept answer, if it is for this `runsc` (and, when the probe gave
/// it, this guest) and not out of date at `now`, read only from a regular
/// file of this user's.
fn read_cache(
    cache: &Path,
    runsc_id: &str,
    guest_id: Option<&str>,
    now: u64,
) -> Option<Result<(), String>> {
    use std::io::Read;
    let meta = std::fs::symlink_metadata(cache).ok()?;
    if !meta.file_type().is_file() || meta.uid() != private::euid() {
        return None;
    }
    let mut text = String::new();
    std::fs::File::open(cache)
        .ok()?
        .take(CACHE_CAP)
        .read_to_string(&mut text)
        .ok()?;
    let mut lines = text.lines();
    (lines.next()? == CACHE_FORMAT).then_some(())?;
    (lines.next()?.strip_prefix("runsc ")? == runsc_id).then_some(())?;
    match lines.next()?.strip_prefix("guest ")? {
        "-" => {}
        kept => (Some(kept) == guest_id).then_some(())?,
    }
    match lines.next()?.strip_prefix("until ")? {
        "never" => {}
        until => (now < until.parse::<u64>().ok()?).then_some(())?,
    }
    let verdict = lines.next()?;
    if verdict == "ok" {
        Some(Ok(()))
    } else {
        Some(Err(verdict.strip_prefix("unfit ")?.to_string()))
    }
}

/// Keeps the answer (written whole, then renamed into place) for this
/// `runsc`, this guest (`None`: any) and until `until` (seconds since the
/// epoch; `None`: for good).
fn write_cache(
    cache: &Path,
    runsc_id: &str,
    guest_id: Option<&str>,
    until: Option<u64>,
    verdict: &Result<(), String>,
) -> std::io::Result<()> {
    let dir = cache.parent().unwrap_or(Path::new("."));
    let mut file = tempfile::NamedTempFile::new_in(dir)?;
    let verdict = match verdict {
        Ok(()) => "ok".to_string(),
        Err(reason) => format!("unfit {}", reason.replace('\n', " ")),
    };
    writeln!(
        file,
        "{CACHE_FORMAT}\nrunsc {runsc_id}\nguest {}\nuntil {}\n{verdict}",
        guest_id.unwrap_or("-"),
        until.map_or("never".to_string(), |t| t.to_string())
    )?;
    file.persist(cache).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake `runsc` in `dir` that prints `version` for `--version` and
    /// `probe` (the guest's line, or nothing and exit 3 when empty) for
    /// `do`, counting its runs in `runs` beside it.
    fn fake_runsc(dir: &Path, version: &str, probe: &str) -> PathBuf {
        let path = dir.join("runsc");
        let runs = dir.join("runs");
        let answer = if probe.is_empty() {
            "echo 'cannot start' >&2; exit 3".to_string()
        } else {
            format!("echo '{probe}'; exit 0")
        };
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho run >> '{}'\n[ \"$1\" = --version ] && echo '{version}' && echo 'spec: 1.0.2-dev' && exit 0\nfor a; do [ \"$a\" = do ] && {{ {answer}; }}; done\nexit 3\n",
                runs.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn runs(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("runs"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    /// A file standing for the guest (the fake `runsc` never runs it).
    fn guest(dir: &Path, content: &str) -> PathBuf {
        let path = dir.join("guest");
        std::fs::write(&path, content).unwrap();
        path
    }

    const FIT: &str = "--stat-probe statx=0 newfstatat=22";

    #[test]
    fn the_release_date_is_read_from_upstream_s_and_debian_s_versions() {
        assert_eq!(
            release_date("runsc version release-20231030.0"),
            Some(20231030)
        );
        assert_eq!(release_date("runsc version 0.0~20221219.0"), Some(20221219));
        assert_eq!(
            release_date("runsc version 0.0~git20240105.1-1"),
            Some(20240105)
        );
        for none in [
            "runsc version VERSION_MISSING",
            "runsc version 0.0.0",
            "runsc version 202312",
            "runsc version 120231030",
            "runsc version 20231399.0",
            "",
        ] {
            assert_eq!(release_date(none), None, "{none}");
        }
    }

    #[test]
    fn a_runsc_before_the_statx_fix_is_unfit_and_one_after_it_fit() {
        let runsc = Path::new("/usr/bin/runsc");
        let reason = verdict_by_date(runsc, "runsc version 0.0~20221219.0", 20221219).unwrap_err();
        for word in [
            "/usr/bin/runsc",
            "0.0~20221219.0",
            "statx",
            "AT_NO_AUTOMOUNT",
            "EINVAL",
            "ls -la",
            "stat",
            "release-20230227.0",
        ] {
            assert!(reason.contains(word), "{word}: {reason}");
        }
        assert!(!reason.contains('\n'), "{reason}");
        assert!(verdict_by_date(runsc, "v", 20230226).is_err());
        assert!(verdict_by_date(runsc, "v", STATX_FIXED).is_ok());
        assert!(verdict_by_date(runsc, "v", FSTATAT_FIXED).is_ok());
        let probe = |statx, newfstatat| StatProbe { statx, newfstatat };
        assert!(verdict_by_probe(runsc, "v", probe(0, 0)).is_ok());
        assert!(verdict_by_probe(runsc, "v", probe(0, EINVAL)).is_ok());
        let reason = verdict_by_probe(runsc, "v", probe(EINVAL, EINVAL)).unwrap_err();
        assert!(
            reason.contains("EINVAL") && reason.contains("probe"),
            "{reason}"
        );
        assert!(verdict_by_probe(runsc, "v", probe(1, 0))
            .unwrap_err()
            .contains("errno 1"));
    }

    #[test]
    fn a_runsc_before_the_fix_is_judged_by_its_version_once_per_binary() {
        let dir = tempfile::tempdir().unwrap();
        let runsc = fake_runsc(dir.path(), "runsc version 0.0~20221219.0", FIT);
        let guest = guest(dir.path(), "1");
        let first = everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap_err();
        assert!(first.contains("20221219"), "{first}");
        assert_eq!(runs(dir.path()), 1, "--version only, no probe");
        // Kept, for any guest: the second call does not run runsc.
        let second = everyday_tools_work_with(&runsc, None, Some(dir.path())).unwrap_err();
        assert_eq!(second, first);
        assert_eq!(runs(dir.path()), 1);
        // Another runsc in its place: worked out again.
        // (Of another size: a rewrite within one clock tick keeps the times.)
        fake_runsc(dir.path(), "runsc version 0.0~20230101.0-1", FIT);
        everyday_tools_work_with(&runsc, None, Some(dir.path())).unwrap_err();
        assert_eq!(runs(dir.path()), 2);
        // Without a directory to keep it in, every call works it out.
        everyday_tools_work_with(&runsc, None, None).unwrap_err();
        assert_eq!(runs(dir.path()), 3);
    }

    #[test]
    fn a_later_runsc_is_judged_by_a_probe_once_per_binary_and_guest() {
        let dir = tempfile::tempdir().unwrap();
        let runsc = fake_runsc(dir.path(), "runsc version release-20231030.0", FIT);
        let guest = guest(dir.path(), "1");
        everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap();
        assert_eq!(runs(dir.path()), 2, "--version and the probe");
        everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap();
        assert_eq!(runs(dir.path()), 2, "kept");
        // Another guest: probed again.
        std::fs::write(&guest, "22").unwrap();
        everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap();
        assert_eq!(runs(dir.path()), 4);
        // A probe that finds statx refused: unfit, whatever the version.
        let runsc = fake_runsc(
            dir.path(),
            "runsc version VERSION_MISSING",
            "--stat-probe statx=22 newfstatat=22",
        );
        let reason = everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap_err();
        assert!(
            reason.contains("VERSION_MISSING") && reason.contains("EINVAL"),
            "{reason}"
        );
        assert_eq!(runs(dir.path()), 6);
        everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap_err();
        assert_eq!(runs(dir.path()), 6, "kept");
    }

    #[test]
    fn a_check_that_cannot_run_makes_runsc_unfit() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-runsc");
        let reason = everyday_tools_work_with(&missing, None, Some(dir.path())).unwrap_err();
        assert!(reason.contains("not found"), "{reason}");
        let reason =
            everyday_tools_work_with(Path::new("hako-no-such-runsc"), None, None).unwrap_err();
        assert!(reason.contains("hako-no-such-runsc"), "{reason}");
        // No guest to probe with: not kept (it cost one --version).
        let runsc = fake_runsc(dir.path(), "runsc version release-20231030.0", FIT);
        for round in 1..=2 {
            let reason = everyday_tools_work_with(&runsc, None, Some(dir.path())).unwrap_err();
            assert!(reason.contains("cannot be checked"), "{reason}");
            assert_eq!(runs(dir.path()), round, "not kept");
        }
        assert!(!dir.path().join(CACHE_FILE).exists());
        // A runsc whose --version fails: not kept either.
        let broken = dir.path().join("broken");
        std::fs::write(&broken, "#!/bin/sh\necho oops >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&broken, std::fs::Permissions::from_mode(0o755)).unwrap();
        let reason = everyday_tools_work_with(&broken, None, Some(dir.path())).unwrap_err();
        assert!(
            reason.contains("--version failed") && reason.contains("oops"),
            "{reason}"
        );
        assert!(!dir.path().join(CACHE_FILE).exists());
    }

    #[test]
    fn a_runsc_that_cannot_start_a_sandbox_is_unfit_and_that_is_kept_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let runsc = fake_runsc(dir.path(), "runsc version release-20231030.0", "");
        let guest = guest(dir.path(), "1");
        let reason = everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap_err();
        assert!(
            reason.contains("cannot start a sandbox") && reason.contains("cannot start"),
            "{reason}"
        );
        assert_eq!(runs(dir.path()), 2);
        let again = everyday_tools_work_with(&runsc, Some(&guest), Some(dir.path())).unwrap_err();
        assert_eq!(again, reason);
        assert_eq!(runs(dir.path()), 2, "kept for a while");
        // Once the while is over, it is tried again.
        let cache = dir.path().join(CACHE_FILE);
        let (runsc_id, guest_id) = (identity(&runsc).unwrap(), identity(&guest).unwrap());
        let later = now() + RETRY.as_secs() + 1;
        assert_eq!(read_cache(&cache, &runsc_id, Some(&guest_id), later), None);
        assert!(read_cache(&cache, &runsc_id, Some(&guest_id), now()).is_some());
    }

    #[test]
    fn a_kept_answer_for_another_binary_or_in_a_planted_file_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join(CACHE_FILE);
        write_cache(&cache, "R", None, None, &Err("old".into())).unwrap();
        assert_eq!(read_cache(&cache, "R", None, 0), Some(Err("old".into())));
        assert_eq!(
            read_cache(&cache, "R", Some("G"), 0),
            Some(Err("old".into()))
        );
        assert_eq!(read_cache(&cache, "other", None, 0), None);
        // Decided by a probe: only for the same guest.
        write_cache(&cache, "R", Some("G"), None, &Ok(())).unwrap();
        assert_eq!(read_cache(&cache, "R", Some("G"), 0), Some(Ok(())));
        assert_eq!(read_cache(&cache, "R", Some("H"), 0), None);
        assert_eq!(read_cache(&cache, "R", None, 0), None);
        // A symlink to an answer is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&cache, &link).unwrap();
        assert_eq!(read_cache(&link, "R", Some("G"), 0), None);
        // Garbage is no answer.
        std::fs::write(&cache, format!("{CACHE_FORMAT}\nrunsc R\nguest -\n")).unwrap();
        assert_eq!(read_cache(&cache, "R", None, 0), None);
        std::fs::write(
            &cache,
            format!("{CACHE_FORMAT}\nrunsc R\nguest -\nuntil soon\nok\n"),
        )
        .unwrap();
        assert_eq!(read_cache(&cache, "R", None, 0), None);
    }
}
