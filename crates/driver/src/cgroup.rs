//! cgroup limits for a sandbox: v2 where a writable unified hierarchy
//! offers the controllers, v1 where that is what the host has (memory,
//! pids, cpu under `/sys/fs/cgroup/<controller>`). Each sandbox gets its own
//! group below the caller's, so an outer limit still applies; the group is
//! removed when the sandbox closes.

use std::path::{Path, PathBuf};

use hako_core::{LimitMechanism, Limits};

const ROOT: &str = "/sys/fs/cgroup";

/// The groups of one sandbox.
#[derive(Debug)]
pub struct Cgroups {
    dirs: Vec<PathBuf>,
    /// The memory group's count of OOM kills (v1 `memory.oom_control`, v2
    /// `memory.events`), when memory is limited.
    oom_counter: Option<PathBuf>,
    /// Which hierarchy enforces the limits.
    pub mechanism: LimitMechanism,
}

/// The caller's group in each hierarchy, from `/proc/self/cgroup`:
/// controller list ("" for v2) and path.
fn own_groups() -> Vec<(String, String)> {
    std::fs::read_to_string("/proc/self/cgroup")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let _id = parts.next()?;
            Some((parts.next()?.to_string(), parts.next()?.to_string()))
        })
        .collect()
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    std::fs::write(path, value).map_err(|e| format!("write {value} to {}: {e}", path.display()))
}

impl Cgroups {
    /// Creates the groups for `limits` (memory, pids, cpus), or returns
    /// `Ok(None)` when none is asked for, and `Err` when they cannot be made
    /// here (the caller falls back to rlimits or refuses).
    pub fn create(limits: &Limits, name: &str) -> Result<Option<Cgroups>, String> {
        if limits.memory.is_none() && limits.pids.is_none() && limits.cpus_milli.is_none() {
            return Ok(None);
        }
        let groups = own_groups();
        if let Some((_, path)) = groups.iter().find(|(c, _)| c.is_empty()) {
            let base = Path::new(ROOT).join(path.trim_start_matches('/'));
            let controllers =
                std::fs::read_to_string(base.join("cgroup.controllers")).unwrap_or_default();
            let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
            let needed = [
                (limits.memory.is_some(), "memory"),
                (limits.pids.is_some(), "pids"),
                (limits.cpus_milli.is_some(), "cpu"),
            ];
            if needed.iter().all(|&(want, c)| !want || has(c)) {
                if let Ok(cg) = Self::create_v2(&base, limits, name) {
                    return Ok(Some(cg));
                }
            }
        }
        Self::create_v1(&groups, limits, name).map(Some)
    }

    fn create_v2(base: &Path, limits: &Limits, name: &str) -> Result<Cgroups, String> {
        let dir = base.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let mut cg = Cgroups {
            dirs: vec![dir.clone()],
            oom_counter: None,
            mechanism: LimitMechanism::CgroupV2,
        };
        if let Some(bytes) = limits.memory {
            write(&dir.join("memory.max"), &bytes.to_string())?;
            cg.oom_counter = Some(dir.join("memory.events"));
            let _ = write(&dir.join("memory.swap.max"), "0");
        }
        if let Some(n) = limits.pids {
            write(&dir.join("pids.max"), &n.to_string())?;
        }
        if let Some(milli) = limits.cpus_milli {
            write(&dir.join("cpu.max"), &format!("{} 100000", milli * 100))?;
        }
        Ok(cg)
    }

    fn create_v1(
        groups: &[(String, String)],
        limits: &Limits,
        name: &str,
    ) -> Result<Cgroups, String> {
        let mut cg = Cgroups {
            dirs: Vec::new(),
            oom_counter: None,
            mechanism: LimitMechanism::CgroupV1,
        };
        let mut oom_counter = None;
        let mut make = |controller: &str| -> Result<PathBuf, String> {
            let own = groups
                .iter()
                .find(|(c, _)| c.split(',').any(|x| x == controller))
                .map(|(_, p)| p.trim_start_matches('/').to_string())
                .ok_or_else(|| format!("no cgroup v1 {controller} hierarchy"))?;
            let dir = Path::new(ROOT).join(controller).join(own).join(name);
            std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            cg.dirs.push(dir.clone());
            Ok(dir)
        };
        if let Some(bytes) = limits.memory {
            let dir = make("memory")?;
            write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
            oom_counter = Some(dir.join("memory.oom_control"));
            // Swap counts too, where the kernel accounts it.
            let _ = write(&dir.join("memory.memsw.limit_in_bytes"), &bytes.to_string());
        }
        if let Some(n) = limits.pids {
            let dir = make("pids")?;
            write(&dir.join("pids.max"), &n.to_string())?;
        }
        if let Some(milli) = limits.cpus_milli {
            let dir = make("cpu")?;
            write(&dir.join("cpu.cfs_period_us"), "100000")?;
            write(&dir.join("cpu.cfs_quota_us"), &(milli * 100).to_string())?;
        }
        cg.oom_counter = oom_counter;
        Ok(cg)
    }

    /// The file the guest reads the memory limit's kills from, when memory
    /// is limited.
    pub fn oom_counter(&self) -> Option<PathBuf> {
        self.oom_counter.clone()
    }

    /// The `cgroup.procs` files a process writes its pid to, to join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Removes the groups (they must be empty: call after the sandbox's
    /// processes are gone). Retries briefly while exiting processes leave.
    pub fn remove(&mut self) {
        for dir in self.dirs.drain(..) {
            for _ in 0..100 {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
        }
    }
}

/// The cgroups of a new sandbox of `backend`, where they can be made
/// (`Ok(None)`: none asked for, or none can be made and rlimits will do),
/// named uniquely. Refused, unless `best_effort`: `--cpus` with no cgroup
/// (no rlimit stands in), and `--pids` with no cgroup when hako runs as
/// root (`RLIMIT_NPROC` counts nothing of uid 0, and of root's user
/// namespace).
pub fn for_sandbox(
    backend: &str,
    limits: &Limits,
    best_effort: bool,
) -> hako_core::Result<Option<Cgroups>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = format!(
        "hako-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let refuse = |message: String| hako_core::Error::Backend {
        backend: backend.into(),
        op: "apply limits",
        message,
    };
    let cgroups = match Cgroups::create(limits, &name) {
        Ok(cg) => cg,
        Err(why) if limits.cpus_milli.is_some() && !best_effort => {
            return Err(refuse(format!("--cpus needs a cgroup and none could be made here ({why}); pass --best-effort to run without the CPU limit")));
        }
        Err(_) => None,
    };
    if limits.pids.is_some()
        && cgroups.is_none()
        && hako_sys::rustix::process::geteuid().is_root()
        && !best_effort
    {
        return Err(refuse("--pids needs a cgroup when hako runs as root, and none could be made here; pass --best-effort to run without it".into()));
    }
    Ok(cgroups)
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        self.remove();
    }
}
