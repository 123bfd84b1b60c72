//! The vm backend's start-up: a cold start (QEMU booting the image until
//! the first command has run in the sandbox, no snapshot) against QEMU
//! booting the same kernel and initramfs to a trivial init; and a start
//! from a snapshot of an idle VM against the cold start.

use std::path::Path;
use std::time::{Duration, Instant};

use hako_core::{Command, Sandbox, SandboxSpec};

use crate::measure::alternate;
use crate::report::{compare, Comparison};

/// Boots are seconds long under TCG: at most this many runs of each.
pub(crate) const MAX_BOOTS: usize = 10;

/// QEMU's bare boot, from its start to its exit.
fn bare_boot(argv: &[String]) -> Result<Duration, String> {
    let start = Instant::now();
    let status = std::process::Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    let took = start.elapsed();
    if !status.success() {
        return Err(format!("the bare boot ended with {status}"));
    }
    Ok(took)
}

/// A vm sandbox opened and `true` run in it: the time to that command's
/// result (closing it is not counted).
fn start_and_run(workspace: &Path, snapshots: bool) -> Result<Duration, String> {
    let start = Instant::now();
    let mut config = hako_vm::VmConfig::from_spec(SandboxSpec::new(workspace.to_path_buf()));
    config.snapshots = snapshots;
    let sandbox = hako_vm::VmSandbox::new(config).map_err(|e| e.to_string())?;
    let out = sandbox
        .exec(&Command::new(["true"]))
        .map_err(|e| e.to_string())?;
    let took = start.elapsed();
    if !out.status.success() {
        return Err(format!("true in the vm sandbox: {out:?}"));
    }
    if snapshots
        && sandbox.start_report().map(|r| r.kind) != Some(hako_vm::StartKind::Restored)
        && sandbox.start_report().map(|r| r.kind) != Some(hako_vm::StartKind::ColdSaved)
    {
        return Err("the vm sandbox did not start from a snapshot".into());
    }
    sandbox.close().map_err(|e| e.to_string())?;
    Ok(took)
}

/// Pushes the two start-up comparisons.
pub(crate) fn bench_starts(
    n: usize,
    workspace: &Path,
    out: &mut Vec<Comparison>,
) -> Result<(), String> {
    let n = n.clamp(1, MAX_BOOTS);
    let plan = hako_vm::default_plan(None).map_err(|e| e.to_string())?;
    let bare = hako_vm::bare_boot_argv(&plan);
    let (cold, boot) = alternate(n, || start_and_run(workspace, false), || bare_boot(&bare))?;
    out.push(compare(
        "vm_cold_start.ratio_vs_bare_boot".into(),
        format!(
            "a vm sandbox booted ({}, no snapshot) until `true` has run in it",
            plan.accel.name()
        ),
        Some("vm"),
        cold,
        "QEMU booting the same kernel and initramfs to a trivial init (rdinit=/bin/true), start to exit",
        boot,
    ));
    // The first start from snapshots makes one, if none was there.
    let (restored, cold) = alternate(
        n,
        || start_and_run(workspace, true),
        || start_and_run(workspace, false),
    )?;
    out.push(compare(
        "vm_snapshot_start.ratio_vs_cold_start".into(),
        "a vm sandbox started from a snapshot of an idle VM until `true` has run in it".into(),
        Some("vm"),
        restored,
        "the same booted cold (no snapshot)",
        cold,
    ));
    Ok(())
}
