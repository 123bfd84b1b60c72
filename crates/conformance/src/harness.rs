//! The fresh world each case runs in: a workspace, a sandbox on it, and an
//! outside directory of sentinels that must never change.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once, RwLock};

use hako_core::{Error, FileKind, Sandbox};

use crate::check::{host_kind, Ctx, Res};
use crate::{procs, Case, Factory, Outcome};

/// A host variable that looks like a secret, set in the test process before
/// any sandbox is built; no command may see it.
pub(crate) const SECRET_NAME: &str = "HAKO_CONFORMANCE_SECRET_TOKEN";
/// A second one, named like an API key.
pub(crate) const SECRET_KEY_NAME: &str = "HAKO_CONFORMANCE_API_KEY";
/// The value both carry.
pub(crate) const SECRET_VALUE: &str = "hako-conformance-canary-7f3a9c";

/// What `outside/secret` holds.
pub(crate) const OUTSIDE_SECRET: &[u8] = b"OUTSIDE-SECRET";
/// What `outside/dir/inner` holds.
pub(crate) const OUTSIDE_INNER: &[u8] = b"OUTSIDE-INNER";

static PREPARE: Once = Once::new();

/// Sets the secret-looking variables once per process, before the first
/// sandbox is built (backends read the host environment when built).
pub(crate) fn prepare_process() {
    PREPARE.call_once(|| {
        std::env::set_var(SECRET_NAME, SECRET_VALUE);
        std::env::set_var(SECRET_KEY_NAME, SECRET_VALUE);
    });
}

/// One node of a directory tree, as `lstat` and a read see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    Dir { mode: u32 },
    File { mode: u32, data: Vec<u8> },
    Symlink { target: PathBuf },
    Other { kind: FileKind, mode: u32 },
}

/// A directory tree by relative path.
pub(crate) type Snapshot = BTreeMap<PathBuf, Node>;

/// Walks `dir` without following symlinks or crossing into other file
/// systems (a procfs mounted inside is recorded as a directory, not walked),
/// skipping the relative path `skip`.
pub(crate) fn snapshot(dir: &Path, skip: Option<&Path>) -> io::Result<Snapshot> {
    let dev = dir.symlink_metadata()?.dev();
    let mut out = Snapshot::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel))? {
            let entry = entry?;
            let rel_child = rel.join(entry.file_name());
            if Some(rel_child.as_path()) == skip {
                continue;
            }
            let path = entry.path();
            let meta = path.symlink_metadata()?;
            let mode = meta.permissions().mode() & 0o7777;
            let node = match host_kind(&path) {
                Some(FileKind::Dir) => {
                    if meta.dev() == dev {
                        stack.push(rel_child.clone());
                    }
                    Node::Dir { mode }
                }
                Some(FileKind::File) => Node::File {
                    mode,
                    data: std::fs::read(&path)?,
                },
                Some(FileKind::Symlink) => Node::Symlink {
                    target: std::fs::read_link(&path)?,
                },
                kind => Node::Other {
                    kind: kind.unwrap_or(FileKind::Unknown),
                    mode,
                },
            };
            out.insert(rel_child, node);
        }
    }
    Ok(out)
}

fn describe(node: Option<&Node>) -> String {
    match node {
        None => "nothing".into(),
        Some(Node::File { mode, data }) => {
            format!("a file (mode {mode:o}) {}", crate::check::show(data))
        }
        Some(Node::Dir { mode }) => format!("a directory (mode {mode:o})"),
        Some(Node::Symlink { target }) => format!("a symlink to {target:?}"),
        Some(Node::Other { kind, mode }) => format!("a {kind} (mode {mode:o})"),
    }
}

/// Describes how two snapshots differ, `None` when they are equal.
pub(crate) fn diff(before: &Snapshot, after: &Snapshot) -> Option<String> {
    let keys: std::collections::BTreeSet<&PathBuf> = before.keys().chain(after.keys()).collect();
    let changes: Vec<String> = keys
        .into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| {
            format!(
                "{k:?} was {}, is now {}",
                describe(before.get(k)),
                describe(after.get(k))
            )
        })
        .collect();
    if changes.is_empty() {
        return None;
    }
    let mut out = changes[..changes.len().min(8)].join("; ");
    if changes.len() > 8 {
        let _ = write!(out, "; and {} more", changes.len() - 8);
    }
    Some(out)
}

/// The world one case runs in.
///
/// The host directory holds `ws/` (the workspace the sandbox is built on)
/// and `outside/` (sentinels: `outside/secret` = `OUTSIDE-SECRET`,
/// `outside/dir/inner` = `OUTSIDE-INNER`). Nothing beside `ws/` may change
/// through the sandbox; the harness checks that after the case.
pub struct Harness {
    case: &'static str,
    sandbox: Box<dyn Sandbox>,
    factory: Arc<Factory>,
    root: PathBuf,
    workspace: PathBuf,
    outside: PathBuf,
    expected_outside: Mutex<Snapshot>,
    markers: Mutex<Vec<String>>,
    cleanups: Mutex<Vec<Box<dyn FnOnce() + Send>>>,
    counter: AtomicU64,
    // Last, so that it is removed after everything else is dropped.
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("case", &self.case)
            .field("workspace", &self.workspace)
            .field("outside", &self.outside)
            .finish_non_exhaustive()
    }
}

static MARKER_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A number no other test on this machine is using right now: markers go in
/// command lines (`sleep <marker>`), so a leftover process can be found.
fn unique_number() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let n = MARKER_COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut x =
        nanos ^ (u64::from(std::process::id()) << 32) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64 finaliser: spread the bits.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    // Nine digits, never starting with 0: a valid `sleep` duration.
    100_000_000 + x % 800_000_000
}

impl Harness {
    fn new(case: &'static str, factory: Arc<Factory>) -> Result<Harness, Outcome> {
        let failed = |what: &str, e: &dyn std::fmt::Debug| {
            Outcome::Failed(format!("harness: cannot {what}: {e:?}"))
        };
        let dir = tempfile::Builder::new()
            .prefix("hako-conformance-")
            .tempdir()
            .map_err(|e| failed("create a temporary directory", &e))?;
        let root = std::fs::canonicalize(dir.path()).map_err(|e| failed("canonicalize", &e))?;
        let workspace = root.join("ws");
        let outside = root.join("outside");
        let setup = || -> io::Result<()> {
            std::fs::create_dir(&workspace)?;
            std::fs::set_permissions(&workspace, std::fs::Permissions::from_mode(0o755))?;
            std::fs::create_dir_all(outside.join("dir"))?;
            std::fs::write(outside.join("secret"), OUTSIDE_SECRET)?;
            std::fs::set_permissions(
                outside.join("secret"),
                std::fs::Permissions::from_mode(0o644),
            )?;
            std::fs::write(outside.join("dir/inner"), OUTSIDE_INNER)
        };
        setup().map_err(|e| failed("set up the workspace", &e))?;
        let expected = snapshot(&root, Some(Path::new("ws")))
            .map_err(|e| failed("snapshot the outside", &e))?;
        let sandbox = factory(&workspace).map_err(|e| match e {
            // A backend that cannot run on this host at all: a skip (a
            // failure under HAKO_MUST_WORK=1).
            Error::Unsupported { .. } => Outcome::Skipped(e.to_string()),
            e => Outcome::Failed(format!(
                "the backend's factory failed on {}: {e}",
                workspace.display()
            )),
        })?;
        Ok(Harness {
            case,
            sandbox,
            factory,
            root,
            workspace,
            outside,
            expected_outside: Mutex::new(expected),
            markers: Mutex::new(Vec::new()),
            cleanups: Mutex::new(Vec::new()),
            counter: AtomicU64::new(0),
            _dir: dir,
        })
    }

    /// The case's name.
    pub fn case(&self) -> &'static str {
        self.case
    }

    /// The sandbox under test.
    pub fn sandbox(&self) -> &dyn Sandbox {
        self.sandbox.as_ref()
    }

    /// Builds another sandbox on the same workspace with the backend's
    /// factory (e.g. to look inside after the first one was closed).
    pub fn new_sandbox(&self) -> Result<Box<dyn Sandbox>, Error> {
        (self.factory)(&self.workspace)
    }

    /// The workspace's host path (canonical).
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The outside directory's host path: a sibling of the workspace.
    pub fn outside(&self) -> &Path {
        &self.outside
    }

    /// The directory holding both `ws/` and `outside/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host path of a workspace-relative path.
    pub fn host_path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.workspace.join(rel)
    }

    /// A fresh marker (nine digits) for a command line; every marker handed
    /// out is looked for among the host's processes after the case.
    pub fn marker(&self) -> String {
        let m = unique_number().to_string();
        if let Ok(mut markers) = self.markers.lock() {
            markers.push(m.clone());
        }
        m
    }

    /// A fresh name for a file a command leaves in the workspace root.
    pub(crate) fn ran_marker(&self) -> PathBuf {
        PathBuf::from(format!(
            ".hako-ran-{}",
            self.counter.fetch_add(1, Ordering::Relaxed)
        ))
    }

    /// Registers something to undo after the case (run last first), before
    /// the workspace is removed: unmounting, killing.
    pub fn defer(&self, f: impl FnOnce() + Send + 'static) {
        if let Ok(mut cleanups) = self.cleanups.lock() {
            cleanups.push(Box::new(f));
        }
    }

    /// Creates a file in the workspace from the host side.
    pub fn plant_file(&self, rel: &str, data: &[u8]) -> Res {
        let path = self.host_path(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).ctx(format!("plant parent of {rel}"))?;
        }
        std::fs::write(&path, data).ctx(format!("plant {rel}"))
    }

    /// Creates a directory (and parents) in the workspace from the host side.
    pub fn plant_dir(&self, rel: &str) -> Res {
        std::fs::create_dir_all(self.host_path(rel)).ctx(format!("plant directory {rel}"))
    }

    /// Creates a symlink in the workspace from the host side.
    pub fn plant_symlink(&self, rel: &str, target: impl AsRef<Path>) -> Res {
        std::os::unix::fs::symlink(target.as_ref(), self.host_path(rel))
            .ctx(format!("plant symlink {rel} -> {:?}", target.as_ref()))
    }

    /// Creates a FIFO in the workspace from the host side.
    pub fn plant_fifo(&self, rel: &str) -> Res {
        use hako_sys::rustix::fs::{mknodat, FileType, Mode, CWD};
        mknodat(
            CWD,
            self.host_path(rel),
            FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .ctx(format!("plant FIFO {rel}"))
    }

    /// Adds a file outside the workspace (relative to `outside/`); it joins
    /// the sentinels that must not change.
    pub fn plant_outside(&self, rel: &str, data: &[u8], mode: u32) -> Res {
        let path = self.outside.join(rel);
        std::fs::write(&path, data).ctx(format!("plant outside/{rel}"))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .ctx(format!("chmod outside/{rel}"))?;
        let now = self.snapshot_outside().ctx("snapshot the outside")?;
        if let Ok(mut expected) = self.expected_outside.lock() {
            *expected = now;
        }
        Ok(())
    }

    fn snapshot_outside(&self) -> io::Result<Snapshot> {
        snapshot(&self.root, Some(Path::new("ws")))
    }

    /// The workspace as the host sees it.
    pub(crate) fn snapshot_workspace(&self) -> io::Result<Snapshot> {
        snapshot(&self.workspace, None)
    }

    /// Fails if anything beside the workspace changed: the sentinels, their
    /// modes, or a new entry next to `ws/`.
    pub fn check_outside(&self) -> Res {
        let now = self.snapshot_outside().ctx("snapshot the outside")?;
        let expected = self
            .expected_outside
            .lock()
            .map_err(|_| Outcome::Failed("harness lock poisoned".into()))?;
        if let Some(d) = diff(&expected, &now) {
            fail!("something outside the workspace changed: {d}");
        }
        Ok(())
    }

    /// Fails (after killing them) if host processes carrying one of this
    /// case's markers remain.
    fn check_no_marked_processes(&self) -> Res {
        let markers = self.markers.lock().map(|m| m.clone()).unwrap_or_default();
        let mut left = Vec::new();
        for m in &markers {
            for (pid, cmdline) in procs::host_processes_with_arg(m) {
                procs::kill(pid);
                left.push(format!("{pid} `{cmdline}`"));
            }
        }
        ensure!(
            left.is_empty(),
            "processes were left behind after the case: {}",
            left.join(", ")
        );
        Ok(())
    }

    fn teardown(&self) -> Res {
        let closed = self.sandbox.close();
        let cleanups = self
            .cleanups
            .lock()
            .map(|mut c| std::mem::take(&mut *c))
            .unwrap_or_default();
        for cleanup in cleanups.into_iter().rev() {
            cleanup();
        }
        closed.ctx("close the sandbox after the case")?;
        self.check_outside()?;
        self.check_no_marked_processes()
    }
}

/// Cases that rename in a tight loop. While one runs, every `..` lookup on
/// the machine may be told to retry (`openat2` returns `EAGAIN` under
/// `RESOLVE_BENEATH` when a rename races it), so they run alone: other
/// cases of this process wait for them, and they wait for the others.
pub(crate) const EXCLUSIVE: &[&str] = &[
    "symlink_swapped_during_write_and_read_is_refused",
    "final_component_swapped_for_a_symlink_is_never_followed",
];

static EXCLUSIVE_LOCK: RwLock<()> = RwLock::new(());

/// Builds a harness, runs the case, tears down and checks what every case
/// must leave untouched.
pub(crate) fn run_in_fresh_harness(case: Case, factory: Arc<Factory>) -> Outcome {
    // A poisoned lock only means another case panicked: carry on.
    let (_shared, _exclusive);
    if EXCLUSIVE.contains(&case.name) {
        _exclusive = EXCLUSIVE_LOCK.write().unwrap_or_else(|e| e.into_inner());
    } else {
        _shared = EXCLUSIVE_LOCK.read().unwrap_or_else(|e| e.into_inner());
    }
    let h = match Harness::new(case.name, factory) {
        Ok(h) => h,
        Err(outcome) => return outcome,
    };
    let outcome = match std::panic::catch_unwind(AssertUnwindSafe(|| (case.run)(&h))) {
        Ok(outcome) => outcome,
        Err(panic) => Outcome::Failed(format!(
            "the case panicked: {}",
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default()
        )),
    };
    let after = h.teardown();
    drop(h);
    match (outcome, after) {
        (Outcome::Failed(m), Err(Outcome::Failed(more))) => {
            Outcome::Failed(format!("{m}; and after the case: {more}"))
        }
        (Outcome::Failed(m), _) => Outcome::Failed(m),
        (_, Err(Outcome::Failed(more))) => Outcome::Failed(format!("after the case: {more}")),
        (outcome, _) => outcome,
    }
}

/// Whether this process runs as root (root-only sub-cases skip otherwise).
pub(crate) fn is_root() -> bool {
    hako_sys::rustix::process::geteuid().is_root()
}
