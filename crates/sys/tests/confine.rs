//! `hako_sys::confine`, each case in fresh processes.
//!
//! A restriction must never land on the test harness itself, so each test
//! runs in three processes:
//!
//! 1. the parent (the harness running the test) re-executes this binary with
//!    `--exact <test>` and `HAKO_CONFINE_STAGE=apply`;
//! 2. that child applies the restriction, then `exec`s this binary once more
//!    with `HAKO_CONFINE_STAGE=check`, as the supervisor `exec`s the command;
//! 3. the checker, which inherited the restriction through `exec`, tries what
//!    should work and what should not, and prints one `hako-confine: key=value`
//!    line per probe.
//!
//! The parent asserts on those lines and on the exit status. Cases that need a
//! privilege the run lacks are skipped with a printed reason, or fail when
//! `HAKO_MUST_WORK=1`.
#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hako_sys::confine::{self, CapsDropped, LandlockRules, Resource, Rlimit};
use hako_sys::rustix;

mod support;
use support::{skip, TempDir};

const STAGE: &str = "HAKO_CONFINE_STAGE";
const DIR: &str = "HAKO_CONFINE_DIR";
const PREFIX: &str = "hako-confine: ";

// ---------------------------------------------------------------------------
// Harness

enum Stage {
    Apply,
    Check,
}

fn stage() -> Option<Stage> {
    match std::env::var(STAGE).as_deref() {
        Ok("apply") => Some(Stage::Apply),
        Ok("check") => Some(Stage::Check),
        _ => None,
    }
}

fn harness_args(test: &str) -> [&str; 4] {
    ["--exact", test, "--nocapture", "--test-threads=1"]
}

/// Parent: runs `test` again in a child at the apply stage, optionally
/// through a wrapper command (such as `unshare`).
fn run_child(test: &str, dir: Option<&Path>, wrapper: &[&str]) -> Output {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = match wrapper.split_first() {
        Some((first, rest)) => {
            let mut c = Command::new(first);
            c.args(rest).arg(&exe);
            c
        }
        None => Command::new(&exe),
    };
    cmd.args(harness_args(test)).env(STAGE, "apply");
    if let Some(dir) = dir {
        cmd.env(DIR, dir);
    }
    cmd.output().unwrap()
}

/// Apply stage: replaces this process with the check stage of `test`.
fn exec_check(test: &str) -> ! {
    let exe = std::env::current_exe().unwrap();
    let err = Command::new(exe)
        .args(harness_args(test))
        .env(STAGE, "check")
        .exec();
    panic!("cannot exec the check stage: {err}");
}

fn dir_from_env() -> PathBuf {
    PathBuf::from(std::env::var_os(DIR).unwrap())
}

fn emit(key: &str, value: impl std::fmt::Display) {
    support::emit(PREFIX, key, value);
}

/// "ok" or the error's errno name.
fn outcome<T>(r: io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".to_owned(),
        Err(e) => errno_name(&e),
    }
}

fn errno_name(e: &io::Error) -> String {
    let name = match e.raw_os_error() {
        Some(libc::EACCES) => "EACCES",
        Some(libc::EPERM) => "EPERM",
        Some(libc::EXDEV) => "EXDEV",
        Some(libc::EFBIG) => "EFBIG",
        Some(libc::EMFILE) => "EMFILE",
        Some(libc::ENOTTY) => "ENOTTY",
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::EEXIST) => "EEXIST",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(n) => return format!("errno{n}"),
        None => return format!("error({e})"),
    };
    name.to_owned()
}

/// Parent: the `key=value` lines a child printed, after checking that it
/// exited 0.
fn results(out: &Output) -> HashMap<String, String> {
    support::results(PREFIX, out)
}

fn parse(stdout: &str) -> HashMap<String, String> {
    support::parse(PREFIX, stdout)
}

#[track_caller]
fn expect(r: &HashMap<String, String>, key: &str, want: &str) {
    assert_eq!(
        r.get(key).map(String::as_str),
        Some(want),
        "{key}: all results: {r:#?}"
    );
}

fn status_fields() -> HashMap<String, String> {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

const CAP_FIELDS: [&str; 5] = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
const ZERO_MASK: &str = "0000000000000000";

fn emit_caps_report(dropped: &CapsDropped) {
    emit("had_setpcap", dropped.had_setpcap);
    emit("securebits_locked", dropped.securebits_locked);
    emit("bounding_set_empty", dropped.bounding_set_empty);
}

/// Check stage: prints the fields of /proc/self/status and the securebits.
fn emit_privileges() {
    let status = status_fields();
    for key in CAP_FIELDS.iter().chain(&["NoNewPrivs"]) {
        emit(key, status.get(*key).map_or("missing", String::as_str));
    }
    let bits = rustix::thread::capabilities_secure_bits()
        .map(|b| format!("{:#x}", b.bits()))
        .unwrap_or_else(|e| format!("error({e})"));
    emit("securebits", bits);
}

/// NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE and their locks, and
/// KEEP_CAPS_LOCKED.
const SECUREBITS_SET: &str = "0xef";

/// Parent: asserts what every capability case shares.
fn assert_no_privileges(r: &HashMap<String, String>) {
    expect(r, "NoNewPrivs", "1");
    for key in ["CapInh", "CapPrm", "CapEff", "CapAmb"] {
        expect(r, key, ZERO_MASK);
    }
    if r.get("bounding_set_empty").map(String::as_str) == Some("true") {
        expect(r, "CapBnd", ZERO_MASK);
    } else {
        // Only a process that never held CAP_SETPCAP (unprivileged, outside
        // a user namespace) may be left with a bounding set, and the report
        // must say so. no_new_privs keeps exec from using it.
        expect(r, "had_setpcap", "false");
        assert_ne!(r.get("CapBnd").map(String::as_str), Some(ZERO_MASK));
        eprintln!("note: no CAP_SETPCAP here, so the bounding set stays as it was");
    }
    if r.get("had_setpcap").map(String::as_str) == Some("true") {
        expect(r, "securebits_locked", "true");
        expect(r, "securebits", SECUREBITS_SET);
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

// ---------------------------------------------------------------------------
// Capabilities and no_new_privs

#[test]
fn after_drop_and_exec_no_capability_is_left_and_no_new_privs_is_set() {
    const TEST: &str = "after_drop_and_exec_no_capability_is_left_and_no_new_privs_is_set";
    match stage() {
        Some(Stage::Apply) => {
            confine::set_no_new_privs().unwrap();
            let dropped = confine::drop_all_capabilities().unwrap();
            emit_caps_report(&dropped);
            exec_check(TEST);
        }
        Some(Stage::Check) => {
            emit_privileges();
            let locked = dir_from_env().join("root-only");
            emit(
                "write_mode_0000_file",
                outcome(std::fs::OpenOptions::new().write(true).open(&locked)),
            );
            emit("read_mode_0000_file", outcome(std::fs::File::open(&locked)));
            return;
        }
        None => {}
    }
    let dir = TempDir::new("confine-caps");
    let locked = dir.0.join("root-only");
    std::fs::write(&locked, "secret").unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let out = run_child(TEST, Some(&dir.0), &[]);
    let r = results(&out);
    assert_no_privileges(&r);
    if is_root() {
        expect(&r, "had_setpcap", "true");
        expect(&r, "bounding_set_empty", "true");
    }
    // Without CAP_DAC_OVERRIDE, not even root (the owner) may open a 0000 file.
    expect(&r, "write_mode_0000_file", "EACCES");
    expect(&r, "read_mode_0000_file", "EACCES");
}

#[test]
fn inside_a_user_namespace_every_set_is_emptied_and_securebits_are_locked() {
    const TEST: &str = "inside_a_user_namespace_every_set_is_emptied_and_securebits_are_locked";
    match stage() {
        Some(Stage::Apply) => {
            confine::set_no_new_privs().unwrap();
            let dropped = confine::drop_all_capabilities().unwrap();
            emit_caps_report(&dropped);
            exec_check(TEST);
        }
        Some(Stage::Check) => {
            emit_privileges();
            // uid 0 of the namespace: a capability would show here.
            emit("uid", rustix::process::geteuid().as_raw());
            return;
        }
        None => {}
    }
    let probe = Command::new("unshare")
        .args(["--user", "--map-root-user", "true"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return skip(&format!(
                "cannot create a user namespace: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ))
        }
        Err(e) => return skip(&format!("cannot run unshare(1): {e}")),
    }
    let out = run_child(TEST, None, &["unshare", "--user", "--map-root-user"]);
    let r = results(&out);
    expect(&r, "uid", "0");
    expect(&r, "had_setpcap", "true");
    expect(&r, "securebits_locked", "true");
    expect(&r, "bounding_set_empty", "true");
    assert_no_privileges(&r);
}

// ---------------------------------------------------------------------------
// Resource limits

const MIB: u64 = 1 << 20;

/// Check stage: writes 50 MB in 1 MiB chunks, printing how far it got.
fn write_50_mb(path: &Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut written = 0u64;
    let mut result = "ok".to_owned();
    while written < 50_000_000 {
        match file.write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) => {
                result = errno_name(&e);
                break;
            }
        }
    }
    emit("written", written);
    emit("write_50_mb", result);
}

fn set_sigxfsz(handler: libc::sighandler_t) {
    // SAFETY: SIG_IGN and SIG_DFL are not functions, so no handler runs;
    // changing a disposition is process-wide and this stage execs next.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, handler) };
    assert_ne!(previous, libc::SIG_ERR);
}

#[test]
fn file_size_limit_refuses_a_50_mb_write_with_efbig_when_sigxfsz_is_ignored() {
    const TEST: &str = "file_size_limit_refuses_a_50_mb_write_with_efbig_when_sigxfsz_is_ignored";
    match stage() {
        Some(Stage::Apply) => {
            confine::apply_rlimits(&[Rlimit::new(Resource::Fsize, 10 * MIB)]).unwrap();
            // An ignored disposition survives exec.
            set_sigxfsz(libc::SIG_IGN);
            exec_check(TEST);
        }
        Some(Stage::Check) => return write_50_mb(&dir_from_env().join("big")),
        None => {}
    }
    let dir = TempDir::new("confine-fsize");
    let r = results(&run_child(TEST, Some(&dir.0), &[]));
    expect(&r, "write_50_mb", "EFBIG");
    expect(&r, "written", &(10 * MIB).to_string());
    assert_eq!(
        std::fs::metadata(dir.0.join("big")).unwrap().len(),
        10 * MIB
    );
}

#[test]
fn file_size_limit_kills_a_50_mb_writer_with_sigxfsz_by_default() {
    const TEST: &str = "file_size_limit_kills_a_50_mb_writer_with_sigxfsz_by_default";
    match stage() {
        Some(Stage::Apply) => {
            // No core file from the SIGXFSZ kill.
            confine::apply_rlimits(&[
                Rlimit::new(Resource::Fsize, 10 * MIB),
                Rlimit::new(Resource::Core, 0),
            ])
            .unwrap();
            set_sigxfsz(libc::SIG_DFL);
            exec_check(TEST);
        }
        Some(Stage::Check) => return write_50_mb(&dir_from_env().join("big")),
        None => {}
    }
    let dir = TempDir::new("confine-fsize-kill");
    let out = run_child(TEST, Some(&dir.0), &[]);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGXFSZ),
        "{:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!parse(&String::from_utf8_lossy(&out.stdout)).contains_key("write_50_mb"));
    assert_eq!(
        std::fs::metadata(dir.0.join("big")).unwrap().len(),
        10 * MIB
    );
}

#[test]
fn address_space_limit_refuses_a_1_gib_allocation() {
    const TEST: &str = "address_space_limit_refuses_a_1_gib_allocation";
    match stage() {
        Some(Stage::Apply) => {
            confine::apply_rlimits(&[Rlimit::new(Resource::AddressSpace, 256 * MIB)]).unwrap();
            exec_check(TEST);
        }
        Some(Stage::Check) => {
            let mut big: Vec<u8> = Vec::new();
            emit(
                "reserve_1_gib",
                outcome(
                    big.try_reserve(1 << 30)
                        .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM)),
                ),
            );
            let mut small: Vec<u8> = Vec::new();
            emit(
                "reserve_16_mib",
                outcome(
                    small
                        .try_reserve(16 << 20)
                        .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM)),
                ),
            );
            return;
        }
        None => {}
    }
    let r = results(&run_child(TEST, None, &[]));
    expect(&r, "reserve_1_gib", "ENOMEM");
    expect(&r, "reserve_16_mib", "ok");
}

#[test]
fn open_files_limit_refuses_the_17th_descriptor_with_emfile() {
    const TEST: &str = "open_files_limit_refuses_the_17th_descriptor_with_emfile";
    match stage() {
        Some(Stage::Apply) => {
            confine::apply_rlimits(&[Rlimit::new(Resource::Nofile, 16)]).unwrap();
            exec_check(TEST);
        }
        Some(Stage::Check) => {
            let mut files = Vec::new();
            let err = loop {
                match std::fs::File::open("/dev/null") {
                    Ok(f) => files.push(f),
                    Err(e) => break e,
                }
            };
            // Descriptors are allocated lowest first, so every number below
            // the limit is now in use.
            let highest = files.last().map_or(-1, |f| {
                use std::os::fd::AsRawFd;
                f.as_raw_fd()
            });
            emit("highest_fd", highest);
            emit("next_open", errno_name(&err));
            return;
        }
        None => {}
    }
    let r = results(&run_child(TEST, None, &[]));
    expect(&r, "highest_fd", "15");
    expect(&r, "next_open", "EMFILE");
}

#[test]
fn a_hard_limit_above_the_current_one_is_clamped_not_raised() {
    const TEST: &str = "a_hard_limit_above_the_current_one_is_clamped_not_raised";
    if let Some(Stage::Apply) = stage() {
        use rustix::process::{getrlimit, Resource as R};
        let before = getrlimit(R::Nofile).maximum.unwrap_or(u64::MAX);
        confine::apply_rlimits(&[Rlimit {
            resource: Resource::Nofile,
            soft: 64,
            hard: Rlimit::INFINITY,
        }])
        .unwrap();
        let after = getrlimit(R::Nofile);
        emit(
            "hard_unchanged",
            after.maximum.unwrap_or(u64::MAX) == before,
        );
        emit(
            "soft",
            after
                .current
                .map_or("unlimited".to_owned(), |s| s.to_string()),
        );
        let err = confine::apply_rlimits(&[Rlimit {
            resource: Resource::Nofile,
            soft: 32,
            hard: 16,
        }])
        .unwrap_err();
        emit("soft_above_hard", err);
        return;
    }
    let r = results(&run_child(TEST, None, &[]));
    expect(&r, "hard_unchanged", "true");
    expect(&r, "soft", "64");
    let msg = r.get("soft_above_hard").unwrap();
    assert!(msg.contains("RLIMIT_NOFILE"), "{msg}");
}

// ---------------------------------------------------------------------------
// Landlock

/// Check stage: `TCGETS` on a descriptor; without Landlock a non-terminal
/// answers ENOTTY, with IoctlDev handled and not granted EACCES.
fn tcgets(path: &str) -> String {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) => return errno_name(&e),
    };
    use std::os::fd::AsRawFd;
    // SAFETY: `termios` is plain data; zeroed is a valid value.
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: TCGETS writes one `termios` through the pointer, which points
    // at a live, writable `termios`; the descriptor is open.
    let ret = unsafe { libc::ioctl(file.as_raw_fd(), libc::TCGETS, &mut termios) };
    if ret == 0 {
        "ok".to_owned()
    } else {
        errno_name(&io::Error::last_os_error())
    }
}

fn truncate_path(path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::truncate(c.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn write_new(path: &Path) -> io::Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?
        .write_all(b"new")
}

/// Check stage of the Landlock case: one line per probe.
fn landlock_probes(root: &Path) {
    let a = root.join("a");
    let b = root.join("b");
    use rustix::fs::{mknodat, FileType, Mode, CWD};

    // Beneath A: everything.
    emit("a_create_file", outcome(write_new(&a.join("new"))));
    emit("a_mkdir", outcome(std::fs::create_dir(a.join("sub"))));
    emit(
        "a_rename_within",
        outcome(std::fs::rename(a.join("new"), a.join("sub/new"))),
    );
    emit(
        "a_symlink",
        outcome(std::os::unix::fs::symlink("x", a.join("link"))),
    );
    emit(
        "a_mkfifo",
        outcome(
            mknodat(
                CWD,
                a.join("fifo"),
                FileType::Fifo,
                Mode::from_raw_mode(0o600),
                0,
            )
            .map_err(io::Error::from),
        ),
    );
    emit("a_truncate", outcome(truncate_path(&a.join("sub/new"))));
    emit("a_remove", outcome(std::fs::remove_file(a.join("sub/new"))));

    // Beneath B: nothing but reading.
    let existing = b.join("existing");
    emit("b_create_file", outcome(write_new(&b.join("new"))));
    emit(
        "b_write_existing",
        outcome(std::fs::OpenOptions::new().write(true).open(&existing)),
    );
    emit(
        "b_append_existing",
        outcome(std::fs::OpenOptions::new().append(true).open(&existing)),
    );
    emit("b_truncate", outcome(truncate_path(&existing)));
    emit("b_remove", outcome(std::fs::remove_file(&existing)));
    emit("b_mkdir", outcome(std::fs::create_dir(b.join("sub"))));
    emit("b_rmdir", outcome(std::fs::remove_dir(b.join("empty"))));
    emit(
        "b_symlink",
        outcome(std::os::unix::fs::symlink("x", b.join("link"))),
    );
    emit(
        "b_mkfifo",
        outcome(
            mknodat(
                CWD,
                b.join("fifo"),
                FileType::Fifo,
                Mode::from_raw_mode(0o600),
                0,
            )
            .map_err(io::Error::from),
        ),
    );
    let mut content = String::new();
    emit(
        "b_read",
        outcome(std::fs::File::open(&existing).and_then(|mut f| f.read_to_string(&mut content))),
    );
    emit("b_content", &content);
    emit("b_list", outcome(std::fs::read_dir(&b)));

    // Across: a file of A may not move or be linked into B, nor B's out.
    emit(
        "rename_a_to_b",
        outcome(std::fs::rename(a.join("movable"), b.join("moved"))),
    );
    emit(
        "link_a_to_b",
        outcome(std::fs::hard_link(a.join("movable"), b.join("linked"))),
    );
    emit(
        "rename_b_to_a",
        outcome(std::fs::rename(&existing, a.join("stolen"))),
    );
    emit("movable_still_in_a", a.join("movable").exists());

    // Outside both, and the granted single file.
    emit(
        "sibling_create_file",
        outcome(write_new(&root.join("outside"))),
    );
    emit(
        "dev_null_write",
        outcome(
            std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/null")
                .and_then(|mut f| f.write_all(b"x")),
        ),
    );
    // IoctlDev: granted on /dev/null (a plain ENOTTY), refused on /dev/zero.
    emit("dev_null_ioctl", tcgets("/dev/null"));
    emit("dev_zero_ioctl", tcgets("/dev/zero"));
}

#[test]
fn landlock_lets_the_command_write_only_beneath_the_allowed_paths() {
    const TEST: &str = "landlock_lets_the_command_write_only_beneath_the_allowed_paths";
    match stage() {
        Some(Stage::Apply) => {
            let root = dir_from_env();
            let rules = LandlockRules {
                write_paths: vec![root.join("a"), root.join("does-not-exist")],
                write_files: vec![PathBuf::from("/dev/null")],
            };
            let status = confine::landlock_restrict_writes(&rules).unwrap();
            emit("abi", status.abi);
            emit("fully_enforced", status.fully_enforced);
            emit("skipped", format!("{:?}", status.skipped));
            emit("no_new_privs", rustix::thread::no_new_privs().unwrap());
            exec_check(TEST);
        }
        Some(Stage::Check) => return landlock_probes(&dir_from_env()),
        None => {}
    }
    let Some(abi) = confine::landlock_abi() else {
        return skip("this kernel has no Landlock");
    };
    eprintln!("Landlock ABI {abi}");
    let root = TempDir::new("confine-landlock");
    let (a, b) = (root.0.join("a"), root.0.join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    std::fs::create_dir(b.join("empty")).unwrap();
    std::fs::write(b.join("existing"), "hello").unwrap();
    std::fs::write(a.join("movable"), "m").unwrap();

    let out = run_child(TEST, Some(&root.0), &[]);
    let r = results(&out);
    expect(&r, "abi", &abi.to_string());
    expect(&r, "fully_enforced", "true");
    expect(
        &r,
        "skipped",
        &format!("{:?}", vec![root.0.join("does-not-exist")]),
    );
    expect(&r, "no_new_privs", "true");

    for key in [
        "a_create_file",
        "a_mkdir",
        "a_rename_within",
        "a_symlink",
        "a_mkfifo",
        "a_truncate",
        "a_remove",
        "b_read",
        "b_list",
        "dev_null_write",
    ] {
        expect(&r, key, "ok");
    }
    for key in [
        "b_create_file",
        "b_write_existing",
        "b_append_existing",
        "b_remove",
        "b_mkdir",
        "b_rmdir",
        "b_symlink",
        "b_mkfifo",
        "sibling_create_file",
    ] {
        expect(&r, key, "EACCES");
    }
    // Refer is handled from ABI 2; before it, reparenting is always refused
    // with EXDEV. Either way the file stays where it was.
    for key in ["rename_a_to_b", "link_a_to_b", "rename_b_to_a"] {
        let got = r.get(key).map(String::as_str);
        assert!(
            matches!(got, Some("EACCES" | "EXDEV")),
            "{key}: {got:?}, all: {r:#?}"
        );
    }
    expect(&r, "movable_still_in_a", "true");
    expect(&r, "b_content", "hello");
    assert_eq!(
        std::fs::read_to_string(b.join("existing")).unwrap(),
        "hello"
    );
    if abi >= 3 {
        expect(&r, "b_truncate", "EACCES");
    }
    if abi >= 5 {
        expect(&r, "dev_null_ioctl", "ENOTTY");
        expect(&r, "dev_zero_ioctl", "EACCES");
    }
}

#[test]
fn the_whole_sequence_runs_in_the_supervisors_order() {
    const TEST: &str = "the_whole_sequence_runs_in_the_supervisors_order";
    match stage() {
        Some(Stage::Apply) => {
            let root = dir_from_env();
            confine::apply_rlimits(&[
                Rlimit::new(Resource::Nofile, 64),
                Rlimit::new(Resource::Core, 0),
            ])
            .unwrap();
            let landlock = if confine::landlock_abi().is_some() {
                let rules = LandlockRules {
                    write_paths: vec![root.join("a")],
                    write_files: vec![PathBuf::from("/dev/null")],
                };
                confine::landlock_restrict_writes(&rules).map(|_| ())
            } else {
                Ok(())
            };
            emit("landlock", outcome(landlock.map_err(io::Error::from)));
            confine::set_no_new_privs().unwrap();
            let dropped = confine::drop_all_capabilities().unwrap();
            emit_caps_report(&dropped);
            exec_check(TEST);
        }
        Some(Stage::Check) => {
            emit_privileges();
            let root = dir_from_env();
            emit("a_create_file", outcome(write_new(&root.join("a/new"))));
            emit("outside_create_file", outcome(write_new(&root.join("new"))));
            return;
        }
        None => {}
    }
    let root = TempDir::new("confine-sequence");
    std::fs::create_dir(root.0.join("a")).unwrap();
    let r = results(&run_child(TEST, Some(&root.0), &[]));
    assert_no_privileges(&r);
    expect(&r, "landlock", "ok");
    expect(&r, "a_create_file", "ok");
    if confine::landlock_abi().is_some() {
        expect(&r, "outside_create_file", "EACCES");
    } else {
        skip("this kernel has no Landlock");
    }
}

#[test]
fn landlock_abi_reports_the_kernels_version_without_restricting() {
    match confine::landlock_abi() {
        Some(abi) => {
            eprintln!("Landlock ABI {abi}");
            assert!(abi >= 1);
            // Nothing was restricted: this harness may still write anywhere
            // it could.
            let dir = TempDir::new("confine-abi");
            std::fs::write(dir.0.join("f"), "x").unwrap();
        }
        None => skip("this kernel has no Landlock"),
    }
}
