#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The vm backend against the real QEMU and the image `hako vm build`
//! made (named by `HAKO_VM_IMAGE`, which the test script builds once).
//! Skips without them, unless `HAKO_MUST_WORK=1`. Each case starts a VM
//! (from the snapshot the first one left).

use hako_core::{Command, ExitStatus, Isolation, Sandbox};
use hako_vm::{VmConfig, VmSandbox};

mod support;
use support::ready;

#[test]
fn a_vm_sandbox_runs_its_commands_on_the_guest_s_kernel() {
    if !ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    let mut spec = hako_core::SandboxSpec::new(ws);
    spec.limits.memory = Some(248 << 20);
    let sandbox = VmSandbox::new(VmConfig::from_spec(spec)).unwrap();
    let mine = qemu_with_memory(248);
    assert_eq!(mine.len(), 1, "{mine:?}");
    let caps = sandbox.capabilities();
    // --memory sizes the VM, and is reported as such.
    assert!(
        caps.limits
            .iter()
            .any(|l| l.kind == hako_core::LimitKind::Memory
                && l.value == Some(248 << 20)
                && l.mechanism == hako_core::LimitMechanism::VmSize),
        "{:?}",
        caps.limits
    );
    assert_eq!(caps.isolation, Isolation::Vm);
    assert_eq!(caps.backend, "vm");
    // An emulated VM says so, and every VM names its accelerator.
    assert_eq!(
        caps.accelerator.as_deref(),
        Some(sandbox.accelerator().name())
    );
    let tcg = sandbox.accelerator() == hako_vm::accel::Accelerator::Tcg;
    assert_eq!(
        caps.defects
            .iter()
            .any(|d| d.starts_with("accelerator tcg")),
        tcg,
        "{:?}",
        caps.defects
    );
    let out = sandbox.exec(&Command::new(["uname", "-r"])).unwrap();
    assert_eq!(out.status, ExitStatus::Code(0), "{out:?}");
    let inside = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(inside, host.trim(), "the guest runs the host's kernel");
    let image = hako_vm::image_dir(None).unwrap();
    if let Ok(release) = std::fs::read_to_string(image.join(hako_vm::image::RELEASE_FILE)) {
        assert_eq!(inside, release.trim());
    }
    let out = sandbox
        .exec(&Command::shell(
            "sed -n 's/^MemTotal: *\\([0-9]*\\) kB$/\\1/p' /proc/meminfo",
        ))
        .unwrap();
    let kib: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        kib > 0 && kib <= 248 << 10,
        "MemTotal {kib} kB in a 248 MiB VM"
    );
    // Still serving after a command that fails.
    let out = sandbox.exec(&Command::shell("echo hi; exit 3")).unwrap();
    assert_eq!(out.status, ExitStatus::Code(3), "{out:?}");
    assert_eq!(out.stdout, b"hi\n");
    sandbox.close().unwrap();
    // Closed: no QEMU of this process is left (the guest, the VM's init,
    // exits when hako closes the link, and the VM ends with it).
    let start = std::time::Instant::now();
    while !qemu_with_memory(248).is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "QEMU left after close: {:?}",
            qemu_with_memory(248)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// This process's QEMU children of a VM of `mib` MiB (each test gives its
/// VM a size of its own when it looks for its QEMU: tests run at once).
fn qemu_with_memory(mib: u64) -> Vec<u32> {
    let size = format!("size={mib}M,");
    qemu_children()
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&size))
        })
        .collect()
}

/// This process's children that are QEMU (not yet reaped included).
fn qemu_children() -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let state_ppid: Vec<&str> = rest.split_whitespace().take(2).collect();
            head.contains("(qemu")
                && state_ppid.get(1) == Some(&me.to_string().as_str())
                && state_ppid.first() != Some(&"Z")
        })
        .collect()
}

fn open(spec: hako_core::SandboxSpec) -> VmSandbox {
    VmSandbox::new(VmConfig::from_spec(spec)).unwrap()
}

fn workspace() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap();
    (dir, ws)
}

fn sh(sandbox: &VmSandbox, script: &str) -> hako_core::Output {
    sandbox
        .exec(&Command::shell(script).timeout(std::time::Duration::from_secs(120)))
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn pids_file_size_and_open_files_are_enforced_inside_and_the_sandbox_goes_on() {
    if !ready() {
        return;
    }
    let (_d, ws) = workspace();
    let mut spec = hako_core::SandboxSpec::new(ws.clone());
    spec.limits.pids = Some(40);
    spec.limits.file_size = Some(1 << 20);
    spec.limits.open_files = Some(64);
    let sandbox = open(spec);
    let caps = sandbox.capabilities();
    for (kind, mechanism) in [
        (
            hako_core::LimitKind::Pids,
            hako_core::LimitMechanism::SandboxKernel,
        ),
        (
            hako_core::LimitKind::FileSize,
            hako_core::LimitMechanism::Rlimit,
        ),
        (
            hako_core::LimitKind::OpenFiles,
            hako_core::LimitMechanism::Rlimit,
        ),
    ] {
        assert!(
            caps.limits
                .iter()
                .any(|l| l.kind == kind && l.mechanism == mechanism),
            "{kind:?} by {mechanism:?}: {:?}",
            caps.limits
        );
    }
    // A fork bomb under --pids 40: contained.
    let out = sh(
        &sandbox,
        // Builtins only once the processes are out: nothing else could
        // fork. The sleeps end with the command.
        "sh -c 'i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); echo $i > count; done' 2>/dev/null; \
         read n < count; echo $n; echo done",
    );
    let said = text(&out.stdout);
    let started: u64 = said
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out:?}"));
    assert!(started > 0 && started < 40, "{said}");
    assert!(said.ends_with("done\n"), "{said}");
    // A 5 MB file under --max-file-size 1M is cut at 1 MiB.
    let out = sh(
        &sandbox,
        "dd if=/dev/zero of=big bs=1k count=5000 2>/dev/null; echo $?",
    );
    assert_ne!(text(&out.stdout), "0\n", "{out:?}");
    assert_eq!(std::fs::metadata(ws.join("big")).unwrap().len(), 1 << 20);
    assert_eq!(text(&sh(&sandbox, "ulimit -n").stdout), "64\n");
    // Still usable.
    assert_eq!(text(&sh(&sandbox, "echo still | cat").stdout), "still\n");
    sandbox.close().unwrap();
}

#[test]
fn a_command_over_the_vm_s_memory_is_reported_killed_for_memory_and_the_sandbox_goes_on() {
    if !ready() {
        return;
    }
    let (_d, ws) = workspace();
    let mut spec = hako_core::SandboxSpec::new(ws);
    spec.limits.memory = Some(256 << 20);
    let sandbox = open(spec);
    // Past the VM's memory the guest's kernel kills the command, and the
    // guest counts it (its /proc/vmstat).
    // Many small allocations, each touched (one large one the kernel
    // would refuse at once, as more than the VM has).
    let out = sandbox
        .exec(
            &Command::new([
                "awk",
                "BEGIN { for (i = 0; ; i++) a[i] = sprintf(\"%04000d\", i) }",
            ])
            .timeout(std::time::Duration::from_secs(120)),
        )
        .unwrap();
    assert!(out.oom_killed, "{out:?} {}", text(&out.stderr));
    assert_eq!(out.status, ExitStatus::Signal(9), "{out:?}");
    assert_eq!(text(&sh(&sandbox, "echo again | cat").stdout), "again\n");
    hako_conformance::memory::a_plain_kill_9_is_not_reported_as_memory(&sandbox).unwrap();
    sandbox.close().unwrap();
}

/// Two VMs started from one snapshot: the kernel's generator was reseeded
/// in each with hako's own randomness, so they draw different numbers
/// (a restored kernel otherwise repeats what the snapshot's would have
/// drawn next).
#[test]
fn predictable_randomness_after_a_snapshot_restore_is_prevented() {
    if !ready() {
        return;
    }
    let draw = || {
        let (_d, ws) = workspace();
        let sandbox = open(hako_core::SandboxSpec::new(ws));
        let out = sh(
            &sandbox,
            "head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'",
        );
        let kind = sandbox.start_report().map(|r| r.kind);
        sandbox.close().unwrap();
        (text(&out.stdout), kind)
    };
    let (first, _) = draw();
    let (second, kind) = draw();
    // The second VM came from the snapshot the first left (or was there).
    assert_eq!(kind, Some(hako_vm::StartKind::Restored));
    assert_eq!(first.len(), 64, "{first}");
    assert_ne!(first, second);
}

/// A command cannot take over the guest's link to hako: the port's device
/// is held open by the guest (the kernel allows one opener), and the
/// guest's descriptors in /proc are masked.
#[test]
fn stealing_the_guests_port_is_refused_and_the_sandbox_goes_on() {
    if !ready() {
        return;
    }
    let (_d, ws) = workspace();
    let sandbox = open(hako_core::SandboxSpec::new(ws));
    let out = sh(
        &sandbox,
        "for p in /dev/vport*; do echo x > $p && echo opened $p; cat $p >/dev/null 2>&1 & done; \
         ls /proc/1/fd >/dev/null 2>&1 && echo listed; \
         cat /proc/1/fd/0 >/dev/null 2>&1 && echo read; echo checked",
    );
    assert_eq!(text(&out.stdout), "checked\n", "{out:?}");
    hako_conformance::attacks::writing_on_the_guests_link_through_proc(&sandbox).unwrap();
    assert_eq!(text(&sh(&sandbox, "echo fine").stdout), "fine\n");
    sandbox.close().unwrap();
}

/// Nothing of the host but the workspace is inside: not its processes, not
/// its files; a write outside the workspace stays in the VM.
#[test]
fn the_host_s_processes_and_files_are_not_inside() {
    if !ready() {
        return;
    }
    let (_d, ws) = workspace();
    let secret = tempfile::tempdir().unwrap();
    std::fs::write(secret.path().join("secret"), "host secret").unwrap();
    let sandbox = open(hako_core::SandboxSpec::new(ws));
    // A host process carrying a marker; the pattern inside is written so
    // that the searching command's own arguments do not match it.
    let id = std::process::id();
    let mut host = std::process::Command::new("sleep")
        .arg(format!("600.{id}"))
        .spawn()
        .unwrap();
    let out = sh(
        &sandbox,
        &format!(
            "cat {}/secret 2>/dev/null; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' ' | grep -c '[6]00.{id}'; \
             mkdir -p {} && echo inside > {}/new; echo done",
            secret.path().display(),
            secret.path().display(),
            secret.path().display()
        ),
    );
    host.kill().unwrap();
    host.wait().unwrap();
    assert_eq!(text(&out.stdout), "0\ndone\n", "{out:?}");
    assert!(!secret.path().join("new").exists());
    // The guest's pid 1 is its own init, not the host's.
    let out = sh(&sandbox, "cat /proc/1/comm");
    assert_eq!(text(&out.stdout), ".hako-guest\n", "{out:?}");
    sandbox.close().unwrap();
}

#[test]
fn ro_and_rw_binds_are_shared_at_their_host_paths() {
    if !ready() {
        return;
    }
    let (_d, ws) = workspace();
    let ro = tempfile::tempdir().unwrap();
    let rw = tempfile::tempdir().unwrap();
    let (ro_path, rw_path) = (
        ro.path().canonicalize().unwrap(),
        rw.path().canonicalize().unwrap(),
    );
    std::fs::write(ro_path.join("data"), "read me").unwrap();
    let mut spec = hako_core::SandboxSpec::new(ws);
    spec.ro = vec![ro_path.clone()];
    spec.rw = vec![rw_path.clone()];
    let sandbox = open(spec);
    let out = sh(
        &sandbox,
        &format!(
            "cat {ro}/data; echo; echo x > {ro}/new 2>/dev/null || echo refused; echo made > {rw}/made",
            ro = ro_path.display(),
            rw = rw_path.display()
        ),
    );
    assert_eq!(text(&out.stdout), "read me\nrefused\n", "{out:?}");
    assert!(!ro_path.join("new").exists());
    assert_eq!(
        std::fs::read_to_string(rw_path.join("made")).unwrap(),
        "made\n"
    );
    sandbox.close().unwrap();
}

#[test]
fn a_share_that_would_cover_the_guest_s_system_is_refused_by_name() {
    let (_d, ws) = workspace();
    let mut spec = hako_core::SandboxSpec::new(ws);
    spec.ro = vec![std::path::PathBuf::from("/usr")];
    let err = VmSandbox::new(VmConfig::from_spec(spec))
        .unwrap_err()
        .to_string();
    assert!(err.contains("/usr cannot be shared"), "{err}");
}

#[test]
fn an_emulated_vm_does_not_stand_for_min_isolation_vm_unless_allowed() {
    let detected = hako_vm::accel::detect();
    if detected.accel.is_hardware() {
        eprintln!("SKIPPED an_emulated_vm_does_not_stand_for_min_isolation_vm_unless_allowed: KVM works here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut spec = hako_core::SandboxSpec::new(dir.path().canonicalize().unwrap());
    spec.min_isolation = Isolation::Vm;
    let err = VmSandbox::new(VmConfig::from_spec(spec))
        .unwrap_err()
        .to_string();
    assert!(err.contains("--allow-emulated-vm"), "{err}");
    assert!(err.contains("accelerator tcg"), "{err}");
}

/// QEMU itself, should the code in the VM take it over, is jailed as
/// Firecracker's jailer jails Firecracker: no capability, an unprivileged
/// uid (as root), `no_new_privs` and seccomp, namespaces of its own, and a
/// root holding no host file but what it reads (not the workspace, not
/// /etc's secrets, no /proc).
#[test]
fn a_compromised_vmm_finds_no_capability_no_host_file_and_no_network() {
    if !ready() {
        return;
    }
    let (_d, ws) = workspace();
    std::fs::write(ws.join("in-the-workspace"), "x").unwrap();
    // A memory size no other test's VM has, to tell this QEMU apart.
    let mut spec = hako_core::SandboxSpec::new(ws.clone());
    spec.limits.memory = Some(232 << 20);
    let sandbox = open(spec);
    let qemu = qemu_with_memory(232);
    assert_eq!(qemu.len(), 1, "{qemu:?}");
    let pid = qemu[0];
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    };
    assert_eq!(field("CapEff"), "0000000000000000", "{status}");
    assert_eq!(field("CapPrm"), "0000000000000000", "{status}");
    assert_eq!(field("NoNewPrivs"), "1", "{status}");
    assert_eq!(field("Seccomp"), "2", "{status}");
    // Two filters: hako's (its default policy: no mount, namespace,
    // module, keyring, bpf, ptrace, io_uring...) and QEMU's own on it.
    assert_eq!(field("Seccomp_filters"), "2", "{status}");
    if hako_sys::rustix::process::geteuid().is_root() {
        assert_eq!(field("Uid"), "65534 65534 65534 65534", "{status}");
        assert_eq!(field("Gid"), "65534 65534 65534 65534", "{status}");
    }
    for ns in ["mnt", "net", "ipc", "uts"] {
        let theirs = std::fs::read_link(format!("/proc/{pid}/ns/{ns}")).unwrap();
        let ours = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert_ne!(theirs, ours, "QEMU shares the {ns} namespace");
    }
    let root = std::path::PathBuf::from(format!("/proc/{pid}/root"));
    for absent in [
        ws.join("in-the-workspace"),
        std::path::PathBuf::from("/etc/passwd"),
        std::path::PathBuf::from("/etc/shadow"),
        std::path::PathBuf::from("/proc/self"),
        std::path::PathBuf::from("/sys/kernel"),
        std::path::PathBuf::from("/root"),
        std::path::PathBuf::from("/home"),
        std::path::PathBuf::from("/var/run/docker.sock"),
    ] {
        let inside = root.join(absent.strip_prefix("/").unwrap());
        assert!(!inside.exists(), "{} is in QEMU's root", absent.display());
    }
    let devices: Vec<String> = std::fs::read_dir(root.join("dev"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    for device in &devices {
        assert!(
            ["null", "urandom", "kvm"].contains(&device.as_str()),
            "/dev/{device} in QEMU's root"
        );
    }
    // The sandbox works all the same.
    assert_eq!(text(&sh(&sandbox, "cat in-the-workspace").stdout), "x");
    sandbox.close().unwrap();
}

/// What a command inside may try against the host and the guest: a
/// service on the host's loopback is out of reach (the VM has no NIC);
/// the command holds no capability, has `no_new_privs` and a seccomp
/// filter; signalling every process it can, the guest's pid 1 included,
/// ends neither the sandbox nor its next command.
#[test]
fn the_host_loopback_capabilities_and_signalling_the_guest_are_out_of_reach() {
    if !ready() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let (_d, ws) = workspace();
    let sandbox = open(hako_core::SandboxSpec::new(ws));
    let out = sh(
        &sandbox,
        &format!(
            "echo x | nc -w 2 127.0.0.1 {port} && echo reached; ls /sys/class/net; \
             grep -E '^(CapEff|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status"
        ),
    );
    let said = text(&out.stdout);
    assert!(!said.contains("reached"), "{said}");
    assert!(
        listener.accept().is_err(),
        "a connection reached the host's loopback"
    );
    // Only the guest's own loopback.
    assert!(said.starts_with("lo\n"), "{said}");
    assert!(said.contains("CapEff:\t0000000000000000"), "{said}");
    assert!(said.contains("CapBnd:\t0000000000000000"), "{said}");
    assert!(said.contains("NoNewPrivs:\t1"), "{said}");
    assert!(said.contains("Seccomp:\t2"), "{said}");
    let out = sh(
        &sandbox,
        "for s in KILL TERM INT HUP QUIT USR1 USR2 ALRM; do kill -$s 1; done; echo sent",
    );
    assert_eq!(text(&out.stdout), "sent\n", "{out:?}");
    assert_eq!(
        text(&sh(&sandbox, "echo still here").stdout),
        "still here\n"
    );
    // Every process it may signal: its own supervisor among them, so this
    // command may be reported lost; the sandbox is not.
    let _ = sandbox.exec(&Command::shell("kill -9 -1"));
    assert_eq!(text(&sh(&sandbox, "echo and here").stdout), "and here\n");
    sandbox.close().unwrap();
}
