//! What every guest-run backend's recipe shares, whatever builds its
//! boundary: the limits the guest and hako enforce the same way, the base
//! environment, reports for resource limits, the optional capabilities,
//! and opening the workspace's fence. Pure but for reading this process's
//! environment and opening the fence.

use std::path::Path;

use hako_core::env::EnvPolicy;
use hako_core::{LimitKind, LimitMechanism, LimitReport, Optional, Result};
use hako_fence::Fence;

/// The limits every guest-run sandbox enforces the same way: the command's
/// deadline (the supervisor), the output cap, and the fence's read and
/// listing bounds (hako).
pub fn common_limits(max_output: usize, fence: &Fence) -> Vec<LimitReport> {
    vec![
        LimitReport {
            kind: LimitKind::Timeout,
            value: None,
            mechanism: LimitMechanism::Supervisor,
        },
        LimitReport {
            kind: LimitKind::OutputBytes,
            value: Some(max_output as u64),
            mechanism: LimitMechanism::Hako,
        },
        LimitReport {
            kind: LimitKind::ReadBytes,
            value: Some(fence.max_read()),
            mechanism: LimitMechanism::Hako,
        },
        LimitReport {
            kind: LimitKind::DirEntries,
            value: Some(fence.max_entries() as u64),
            mechanism: LimitMechanism::Hako,
        },
    ]
}

/// The base environment `policy` gives commands, from this process's
/// environment (variables that are not UTF-8 never pass).
pub fn base_env(policy: &EnvPolicy) -> Vec<(String, String)> {
    policy.build(
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
    )
}

/// [`base_env`] with `defaults` set where the policy does not set them
/// (a sandbox's HOME and TMPDIR at its private /tmp, a container's PATH).
pub fn base_env_defaulting(policy: &EnvPolicy, defaults: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut policy = policy.clone();
    for (k, v) in defaults {
        if !policy.set.iter().any(|(name, _)| name == k) {
            policy.set.push(((*k).into(), (*v).into()));
        }
    }
    base_env(&policy)
}

/// Reports for the resource limits asked for: memory, pids and CPUs
/// enforced by `by_cgroup` (a cgroup, the container runtime's, or
/// rlimits), file size and open files by rlimits. A limit not enforced
/// must be left out of `limits` by the caller.
pub fn resource_limit_reports(
    limits: &hako_core::Limits,
    by_cgroup: LimitMechanism,
) -> Vec<LimitReport> {
    [
        (LimitKind::Memory, limits.memory, by_cgroup),
        (LimitKind::Pids, limits.pids, by_cgroup),
        (LimitKind::Cpus, limits.cpus_milli, by_cgroup),
        (
            LimitKind::FileSize,
            limits.file_size,
            LimitMechanism::Rlimit,
        ),
        (
            LimitKind::OpenFiles,
            limits.open_files,
            LimitMechanism::Rlimit,
        ),
    ]
    .into_iter()
    .filter_map(|(kind, value, mechanism)| {
        value.map(|v| LimitReport {
            kind,
            value: Some(v),
            mechanism,
        })
    })
    .collect()
}

/// The optional capabilities every [`GuestSandbox`](crate::sandbox::GuestSandbox) offers (for
/// [`Capabilities::optional`](hako_core::Capabilities::optional)).
pub const OPTIONAL: Optional = Optional {
    read_limit: true,
    append: true,
    make_dir_all: true,
    workdir: true,
    stat: true,
    exec_stream: true,
    sessions: true,
    processes: true,
};

/// Opens the workspace fence: the first step of every backend's
/// constructor.
pub fn open_workspace(workspace: &Path, fence: &hako_fence::FenceOptions) -> Result<Fence> {
    Ok(Fence::open(workspace, fence.clone())?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn a_default_is_set_only_where_the_policy_sets_nothing() {
        let policy = EnvPolicy {
            pass: Vec::new(),
            set: vec![("HOME".into(), "/mine".into())],
        };
        let env = base_env_defaulting(&policy, &[("HOME", "/tmp"), ("TMPDIR", "/tmp")]);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("HOME"), Some("/mine"));
        assert_eq!(get("TMPDIR"), Some("/tmp"));
    }

    #[test]
    fn only_the_limits_asked_for_are_reported_each_with_its_mechanism() {
        let limits = hako_core::Limits {
            memory: Some(1 << 20),
            file_size: Some(10),
            ..hako_core::Limits::default()
        };
        let reports = resource_limit_reports(&limits, LimitMechanism::CgroupV2);
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().any(|r| r.kind == LimitKind::Memory
            && r.value == Some(1 << 20)
            && r.mechanism == LimitMechanism::CgroupV2));
        assert!(reports
            .iter()
            .any(|r| r.kind == LimitKind::FileSize && r.mechanism == LimitMechanism::Rlimit));
        assert!(
            resource_limit_reports(&hako_core::Limits::default(), LimitMechanism::CgroupV2)
                .is_empty()
        );
    }
}
