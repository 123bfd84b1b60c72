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
