//! Reading the process tree from `/proc`.

use std::io;

use rustix::process::Pid;

/// The direct children of `pid`, from `/proc/PID/task/*/children`, falling
/// back to a scan of every `/proc/N/stat` where that file is missing (kernels
/// built without `CONFIG_PROC_CHILDREN`).
pub fn children_of(pid: Pid) -> io::Result<Vec<Pid>> {
    match children_from_task_files(pid) {
        Ok(children) => Ok(children),
        Err(err) if err.kind() == io::ErrorKind::NotFound => children_by_scan(pid),
        Err(err) => Err(err),
    }
}

fn children_from_task_files(pid: Pid) -> io::Result<Vec<Pid>> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{}/task", pid.as_raw_nonzero()))? {
        let path = task?.path().join("children");
        let text = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // The thread exited between the listing and the read.
            Err(err) if err.raw_os_error() == Some(libc::ESRCH) => continue,
            Err(err) => return Err(err),
        };
        out.extend(text.split_whitespace().filter_map(parse_pid));
    }
    Ok(out)
}

fn parse_pid(s: &str) -> Option<Pid> {
    s.parse::<i32>().ok().and_then(Pid::from_raw)
}

/// When process `pid` started, in clock ticks since boot (field 22 of
/// `/proc/PID/stat`); `None` when no such process runs. With the pid it
/// names one process for good (a pid alone may be reused).
pub fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count
    // from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// The parent pid from the text of `/proc/N/stat`.
pub fn ppid_from_stat(stat: &str) -> Option<i32> {
    // The command name is in parentheses and may contain spaces and ')', so
    // parse from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

fn children_by_scan(pid: Pid) -> io::Result<Vec<Pid>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(child) = entry.file_name().to_str().and_then(parse_pid) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) {
            if ppid_from_stat(&stat) == Some(pid.as_raw_nonzero().get()) {
                out.push(child);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ppid_parses_past_hostile_command_names() {
        assert_eq!(ppid_from_stat("12 (sh) S 7 12 12 0"), Some(7));
        assert_eq!(ppid_from_stat("12 (a) b) c) R 99 1 1"), Some(99));
        assert_eq!(ppid_from_stat("garbage"), None);
    }

    #[test]
    fn a_spawned_child_is_listed() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = rustix::process::getpid();
        let pid = Pid::from_raw(child.id() as i32).unwrap();
        assert!(children_of(me).unwrap().contains(&pid));
        assert!(children_by_scan(me).unwrap().contains(&pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// The `[start, end)` addresses of this process's argument and environment
/// strings, from the text of `/proc/self/stat` (fields 48 to 51).
pub fn arg_env_areas(stat: &str) -> Option<([usize; 2], [usize; 2])> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<usize>().ok();
    let areas = ([field(48)?, field(49)?], [field(50)?, field(51)?]);
    (areas.0[0] <= areas.0[1] && areas.1[0] <= areas.1[1]).then_some(areas)
}

/// Where this process's argument and environment strings lie, read once
/// (see [`Disguise::apply`]).
#[derive(Debug, Clone, Copy)]
pub struct Disguise {
    args: [usize; 2],
    env: [usize; 2],
}

impl Disguise {
    /// Reads where this process's argument and environment strings lie. A
    /// child forked afterwards has them at the same addresses, so a parent
    /// may read this for it, off the child's path.
    pub fn of_this_process() -> io::Result<Disguise> {
        let stat = std::fs::read_to_string("/proc/self/stat")?;
        let (args, env) =
            arg_env_areas(&stat).ok_or_else(|| io::Error::other("cannot parse /proc/self/stat"))?;
        Ok(Disguise { args, env })
    }

    /// Makes this process (the one read, or a fork of it) show as `name`:
    /// its command line (`/proc/PID/cmdline`) becomes `name`, its initial
    /// environment (`/proc/PID/environ`) is blanked, and its thread name
    /// (`comm`) is set.
    ///
    /// For a helper forked without exec: it would otherwise show its
    /// parent's arguments and environment to anyone allowed to read them.
    /// The process must not read its own arguments or environment
    /// afterwards (they read as empty) and must be single-threaded.
    pub fn apply(&self, name: &str) -> io::Result<()> {
        let bytes = name.as_bytes();
        for (area, text) in [(self.args, bytes), (self.env, &[][..])] {
            let len = area[1] - area[0];
            if len == 0 {
                continue;
            }
            // Keep a final NUL so the kernel reads the area as plain strings.
            let keep = text.len().min(len - 1);
            let start = area[0] as *mut u8;
            // SAFETY: the kernel reported these ranges as the argument and
            // environment strings of this process or of the process it was
            // forked from (a fork has the same addresses), which lie in its
            // initial stack mapping (readable and writable) and stay mapped
            // for the process's life. The process is single-threaded (the
            // caller's promise), and no Rust reference to these bytes
            // exists: std and libc keep raw pointers to them, which only see
            // the strings change.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), start, keep);
                std::ptr::write_bytes(start.add(keep), 0, len - keep);
            }
        }
        rustix::thread::set_name(
            &std::ffi::CString::new(name).map_err(|_| io::Error::other("name contains NUL"))?,
        )?;
        Ok(())
    }
}

/// Makes this process show as `name` (see [`Disguise::apply`]).
pub fn disguise_as(name: &str) -> io::Result<()> {
    Disguise::of_this_process()?.apply(name)
}

#[cfg(test)]
mod arg_env_tests {
    use super::arg_env_areas;

    #[test]
    fn areas_are_read_after_the_last_parenthesis() {
        let mut stat = String::from("12 (a) b) c) S");
        // Fields 4 to 47, then 48..51, then 52.
        for n in 4..=47 {
            stat.push_str(&format!(" {n}"));
        }
        stat.push_str(" 100 110 110 130 0\n");
        assert_eq!(arg_env_areas(&stat), Some(([100, 110], [110, 130])));
        assert_eq!(arg_env_areas("12 (x) S 1 2"), None);
    }
}
