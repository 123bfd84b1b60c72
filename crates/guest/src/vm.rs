//! pid 1 of a `vm` sandbox: the guest as its own kernel's init.
//!
//! The initramfs `hako vm build` writes starts it (`rdinit=`) with
//! [`FLAG`]. Before it serves, it mounts `/dev`, `/proc`, `/sys` and a
//! `/tmp`, loads the modules listed in [`MODULE_ORDER`] (in that order:
//! the image's builder resolved their dependencies), and opens the
//! virtio-serial port named [`PORT_NAME`], hako's link. There it waits
//! for hako's one [`VmBoot`] line (a VM restored from a snapshot of an
//! idle one is restored here, blocked in that read): fresh randomness for
//! the kernel, and the virtio-fs shares to mount (the workspace, the
//! `--ro`/`--rw` binds), whose devices hako adds once the VM runs. Then it
//! serves the port as a container's guest serves its stdio. When hako
//! closes the port (or dies), the server returns and pid 1's exit ends
//! the machine.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

use hako_proto::{VmBoot, VmMount, VM_BOOT_MAX, VM_BOOT_PREFIX};

use crate::{serve_link, server, GuestExit};

/// The guest's argument that makes it a VM's init.
pub const FLAG: &str = "--vm";
/// Where the image keeps its modules.
pub const MODULES_DIR: &str = "/lib/modules/hako";
/// The modules to load, one file name (in [`MODULES_DIR`]) a line.
pub const MODULE_ORDER: &str = "/lib/modules/hako/order";
/// The virtio-serial port's name (`virtserialport,name=`).
pub const PORT_NAME: &str = "hako";

/// How long the port may take to appear once its driver is loaded.
const PORT_WAIT: Duration = Duration::from_secs(30);
/// How many times, 10 ms apart, a share is tried while its device has not
/// appeared (30 s; counted, not timed: a restored kernel's clock may leap
/// by the time the snapshot lay on disk).
const SHARE_TRIES: u32 = 3000;

/// The VM's init: boots what the guest needs, then serves hako over the
/// port. Says why on the console when it cannot.
pub fn main_vm() -> GuestExit {
    match boot().and_then(|port| {
        let line = read_boot_line(&port)?;
        apply_boot(&line)?;
        if let Some(socket) = &line.net {
            crate::vm_net::start(socket)?;
        }
        Ok(port)
    }) {
        Ok(port) => {
            let Ok(output) = port.try_clone() else {
                eprintln!("hako-guest: cannot duplicate the port's descriptor");
                return GuestExit::Handshake;
            };
            if hako_sys::stdio_to_null().is_err() {
                return GuestExit::Handshake;
            }
            serve_link(server::Link::port(port, output))
        }
        Err(why) => {
            eprintln!("hako-guest: cannot start the VM's guest: {why}");
            GuestExit::Failed
        }
    }
}

fn boot() -> Result<OwnedFd, String> {
    use hako_sys::mount::{mount, MS_NODEV, MS_NOEXEC, MS_NOSUID};
    let mounts: [(&str, &str, hako_sys::mount::Flags, Option<&str>); 7] = [
        ("devtmpfs", "/dev", MS_NOSUID | MS_NOEXEC, Some("mode=0755")),
        (
            "devpts",
            "/dev/pts",
            MS_NOSUID | MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        ),
        (
            "tmpfs",
            "/dev/shm",
            MS_NOSUID | MS_NOEXEC | MS_NODEV,
            Some("mode=1777"),
        ),
        ("proc", "/proc", MS_NOSUID | MS_NOEXEC | MS_NODEV, None),
        ("sysfs", "/sys", MS_NOSUID | MS_NOEXEC | MS_NODEV, None),
        ("tmpfs", "/tmp", MS_NOSUID | MS_NODEV, Some("mode=1777")),
        ("tmpfs", "/run", MS_NOSUID | MS_NODEV, Some("mode=0755")),
    ];
    for (fstype, target, flags, data) in mounts {
        let _ = std::fs::create_dir_all(target);
        match mount(
            Some(Path::new(fstype)),
            Path::new(target),
            Some(fstype),
            flags,
            data,
        ) {
            Ok(()) => {}
            // The kernel may have mounted devtmpfs itself.
            Err(e)
                if e.raw_os_error() == Some(hako_sys::rustix::io::Errno::BUSY.raw_os_error()) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    // What programs expect of /dev beyond the kernel's nodes (a shell's
    // here-documents and process substitution use /dev/fd).
    for (link, target) in [
        ("/dev/fd", "/proc/self/fd"),
        ("/dev/stdin", "/proc/self/fd/0"),
        ("/dev/stdout", "/proc/self/fd/1"),
        ("/dev/stderr", "/proc/self/fd/2"),
    ] {
        let _ = std::os::unix::fs::symlink(target, link);
    }
    // The devpts instance's own multiplexer, not devtmpfs's (which
    // belongs to no instance).
    let _ = std::fs::remove_file("/dev/ptmx");
    std::os::unix::fs::symlink("pts/ptmx", "/dev/ptmx")
        .map_err(|e| format!("link /dev/ptmx: {e}"))?;
    load_modules()?;
    // The VM's only interface: its own loopback (the forwarder listens
    // there in network mode allow; programs expect it in any mode).
    hako_sys::ns::loopback_up().map_err(|e| format!("bring up the loopback: {e}"))?;
    let port = wait_for_port(PORT_NAME)?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map(OwnedFd::from)
        .map_err(|e| format!("open {}: {e}", port.display()))
}

fn load_modules() -> Result<(), String> {
    let order = match std::fs::read_to_string(MODULE_ORDER) {
        Ok(text) => text,
        // A kernel with every driver built in needs no list.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("read {MODULE_ORDER}: {e}")),
    };
    // A module loaded by hand gets no parameter from the kernel's command
    // line (modprobe reads them from there): `NAME.KEY=VALUE` words, as
    // QEMU's microvm writes `virtio_mmio.device=...`.
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    for name in order.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if name.contains('/') {
            return Err(format!("{MODULE_ORDER} names {name:?}, not a file name"));
        }
        let path = Path::new(MODULES_DIR).join(name);
        let file =
            std::fs::File::open(&path).map_err(|e| format!("open {}: {e}", path.display()))?;
        let params = module_params(&cmdline, name);
        hako_sys::module::finit_module(file.as_fd(), &params)
            .map_err(|e| format!("load the module {name}: {e}"))?;
    }
    Ok(())
}

/// The parameters `cmdline` gives the module in `file` (`virtio-mmio.ko`
/// takes `virtio_mmio.KEY=VALUE`; `-` and `_` are the same in a module's
/// name), space separated.
fn module_params(cmdline: &str, file: &str) -> String {
    let module = file.trim_end_matches(".ko").replace('-', "_");
    cmdline
        .split_whitespace()
        .take_while(|w| *w != "--")
        .filter_map(|word| {
            let (name, param) = word.split_once('.')?;
            (name.replace('-', "_") == module && param.contains('=')).then_some(param)
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reads hako's boot line from the port, one byte at a time (what
/// follows it is the protocol's, and stays unread).
fn read_boot_line(port: &OwnedFd) -> Result<VmBoot, String> {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match hako_sys::rustix::io::read(port, &mut byte) {
            Ok(0) => return Err("the link closed before hako's boot line".into()),
            Ok(_) if byte[0] == b'\n' => break,
            Ok(_) => {
                if line.len() >= VM_BOOT_MAX {
                    return Err(format!("hako's boot line is over {VM_BOOT_MAX} bytes"));
                }
                line.push(byte[0]);
            }
            Err(hako_sys::rustix::io::Errno::INTR) => {}
            Err(e) => return Err(format!("read hako's boot line: {e}")),
        }
    }
    parse_boot_line(&line)
}

fn parse_boot_line(line: &[u8]) -> Result<VmBoot, String> {
    let json = line
        .strip_prefix(VM_BOOT_PREFIX.as_bytes())
        .ok_or("the link did not start with hako's boot line")?;
    let boot: VmBoot =
        serde_json::from_slice(json).map_err(|e| format!("hako's boot line: {e}"))?;
    for mount in &boot.mounts {
        check_mount(mount)?;
    }
    Ok(boot)
}

/// A share's tag and mount point, checked before anything is mounted.
fn check_mount(mount: &VmMount) -> Result<(), String> {
    let tag_ok = !mount.tag.is_empty()
        && mount.tag.len() <= 36
        && mount
            .tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !tag_ok {
        return Err(format!("bad share tag {:?}", mount.tag));
    }
    let path_ok = mount.path.is_absolute()
        && mount
            .path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
        && mount.path != Path::new("/");
    if !path_ok {
        return Err(format!("bad mount point {}", mount.path.display()));
    }
    Ok(())
}

/// Reseeds the kernel's randomness and mounts the shares, each once its
/// device has appeared (hako adds them after the VM starts).
fn apply_boot(boot: &VmBoot) -> Result<(), String> {
    let seed = decode_hex(&boot.seed).ok_or("the boot line's seed is not hex")?;
    if let Some(net) = &boot.net {
        check_mount(&VmMount {
            tag: "net".into(),
            path: net.clone(),
            read_only: false,
        })?;
    }
    if seed.len() < 32 {
        return Err("the boot line's seed is under 32 bytes".into());
    }
    hako_sys::random::reseed(&seed).map_err(|e| format!("reseed the kernel's randomness: {e}"))?;
    // Set on pid 1 before anything is forked: every supervisor and
    // command inherits them, and none can raise a hard limit.
    use hako_sys::rustix::process::{setrlimit, Resource, Rlimit};
    for (resource, value, name) in [
        (Resource::Fsize, boot.file_size, "--max-file-size"),
        (Resource::Nofile, boot.open_files, "--max-open-files"),
    ] {
        if let Some(v) = value {
            setrlimit(
                resource,
                Rlimit {
                    current: Some(v),
                    maximum: Some(v),
                },
            )
            .map_err(|e| format!("apply {name} {v}: {e}"))?;
        }
    }
    use hako_sys::mount::{mount, MS_NODEV, MS_NOSUID, MS_RDONLY};
    for share in &boot.mounts {
        std::fs::create_dir_all(&share.path)
            .map_err(|e| format!("create {}: {e}", share.path.display()))?;
        let flags = if share.read_only {
            MS_NOSUID | MS_NODEV | MS_RDONLY
        } else {
            MS_NOSUID | MS_NODEV
        };
        let mut tries = 0;
        loop {
            tries += 1;
            match mount(
                Some(Path::new(&share.tag)),
                &share.path,
                Some("virtiofs"),
                flags,
                None,
            ) {
                Ok(()) => break,
                // No device with that tag yet (virtio-fs says EINVAL).
                Err(e) if e.kind() == std::io::ErrorKind::InvalidInput && tries < SHARE_TRIES => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(format!(
                        "mount the share {} on {}: {e}",
                        share.tag,
                        share.path.display()
                    ))
                }
            }
        }
    }
    Ok(())
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// The device of the port named `wanted`, once its driver made it (or
/// hako added it).
pub(crate) fn wait_for_port(wanted: &str) -> Result<PathBuf, String> {
    let start = Instant::now();
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                let dev = Path::new("/dev").join(entry.file_name());
                if name.trim() == wanted && dev.exists() {
                    return Ok(dev);
                }
            }
        }
        if start.elapsed() > PORT_WAIT {
            return Err(format!(
                "no virtio-serial port named {wanted} after {}s",
                PORT_WAIT.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boot_line_is_checked_before_anything_is_mounted() {
        let good = br#"hako-vm-boot {"seed":"00ff","mounts":[{"tag":"workspace","path":"/workspace","read_only":false}]}"#;
        let boot = parse_boot_line(good).unwrap();
        assert_eq!(boot.mounts[0].tag, "workspace");
        assert_eq!(decode_hex(&boot.seed), Some(vec![0, 255]));
        assert!(parse_boot_line(br#"{"seed":"","mounts":[]}"#).is_err());
        for (tag, path) in [
            ("Work", "/w"),
            ("a/b", "/w"),
            ("", "/w"),
            ("w", "relative"),
            ("w", "/a/../etc"),
            ("w", "/"),
        ] {
            let line = format!(
                r#"hako-vm-boot {{"seed":"00","mounts":[{{"tag":"{tag}","path":"{path}","read_only":true}}]}}"#
            );
            assert!(parse_boot_line(line.as_bytes()).is_err(), "{tag} {path}");
        }
        assert_eq!(decode_hex("0g"), None);
        assert_eq!(decode_hex("abc"), None);
    }

    #[test]
    fn a_module_gets_its_own_parameters_from_the_command_line() {
        let cmdline = "console=ttyS0 virtio_mmio.device=512@0xfeb00e00:12 virtio-mmio.x=1 virtio_pci.force=1 rdinit=/.hako-guest -- virtio_mmio.y=2";
        assert_eq!(
            module_params(cmdline, "virtio_mmio.ko"),
            "device=512@0xfeb00e00:12 x=1"
        );
        assert_eq!(module_params(cmdline, "virtio_pci.ko"), "force=1");
        assert_eq!(module_params(cmdline, "overlay.ko"), "");
    }
}
