//! Where QEMU runs, as Firecracker's jailer runs Firecracker: namespaces
//! of its own (mount, network, IPC, UTS; a user namespace too when hako is
//! not root), a root holding only what QEMU reads (`/usr`, the loader's
//! cache, the kernel and the initramfs, all read-only) and the device
//! nodes it needs (`/dev/null`, `/dev/urandom`, `/dev/kvm` with KVM); no
//! `/proc`, no `/sys`, no home, no workspace (the shares reach it as
//! descriptors, from `virtiofsd`); as root, uid and gid `nobody`
//! (65534) and with them no capability; `no_new_privs`; hako's seccomp
//! filter (its default policy), then QEMU's own on it (`-sandbox on`).
//! What it needs beyond that (the QMP socket, the snapshot file, the
//! shares' sockets) are descriptors hako hands it.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use hako_sys::jail::{Jail, JailBind, JailFilter, JailSpec};

use crate::QemuPlan;

/// The uid and gid QEMU runs as when hako is root.
pub const NOBODY: u32 = 65534;

/// The jail for the QEMU `plan` starts.
pub fn for_qemu(plan: &QemuPlan) -> std::io::Result<Jail> {
    let mut spec = JailSpec::default();
    let ro = |path: &Path| JailBind {
        path: path.to_path_buf(),
        read_only: true,
    };
    spec.binds.push(ro(Path::new("/usr")));
    // Merged /usr: /lib, /lib64, /bin and /sbin are links into it;
    // otherwise directories of their own, bound too.
    for top in ["/lib", "/lib64", "/bin", "/sbin"] {
        let top = Path::new(top);
        match std::fs::read_link(top) {
            Ok(target) => spec.symlinks.push((top.to_path_buf(), target)),
            Err(_) if top.is_dir() => spec.binds.push(ro(top)),
            Err(_) => {}
        }
    }
    let cache = Path::new("/etc/ld.so.cache");
    if cache.is_file() {
        spec.binds.push(ro(cache));
    }
    let qemu = crate::sandbox::which(&plan.qemu).unwrap_or_else(|| plan.qemu.clone());
    if let Some(dir) = qemu.parent().filter(|d| !d.starts_with("/usr")) {
        spec.binds.push(ro(dir));
    }
    for file in [&plan.kernel, &plan.initrd] {
        spec.binds.push(ro(&file.canonicalize()?));
    }
    spec.devices = vec![PathBuf::from("/dev/null"), PathBuf::from("/dev/urandom")];
    let mut groups = Vec::new();
    if plan.accel.is_hardware() {
        let kvm = Path::new("/dev/kvm");
        spec.devices.push(kvm.to_path_buf());
        // /dev/kvm is the kvm group's (0660 on most distributions).
        groups.push(std::fs::metadata(kvm)?.gid());
    }
    spec.run_as = Some((NOBODY, NOBODY, groups));
    // The VM's memory: a file on a tmpfs of the jail's own (a snapshot's
    // memory is copied into it), shared so that virtiofsd can map it.
    spec.ram = Some(plan.memory_mib << 20);
    // hako's own filter under QEMU's: the default policy every sandbox's
    // commands run under (no mount, namespace, module, kexec, keyring,
    // bpf, perf, ptrace, io_uring, userfaultfd, clock...), none of which
    // a VMM needs once its jail is built.
    let program = hako_seccomp::compile(&hako_seccomp::default_policy())
        .map_err(|e| std::io::Error::other(format!("hako's seccomp filter for QEMU: {e}")))?;
    spec.seccomp = Some(JailFilter(program.instructions().into()));
    Jail::new(&spec)
}
