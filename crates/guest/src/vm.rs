//! pid 1 of a `vm` sandbox: the guest as its own kernel's init.
//!
//! The initramfs `hako vm build` writes starts it (`rdinit=`) with
//! [`FLAG`]. Before it serves, it mounts `/dev`, `/proc`, `/sys` and a
//! `/tmp`, loads the modules listed in [`MODULE_ORDER`] (in that order:
//! the image's builder resolved their dependencies), and opens the
//! virtio-serial port named [`PORT_NAME`], hako's link, which it then
//! serves as a container's guest serves its stdio. When hako closes the
//! port (or dies), the server returns and pid 1's exit ends the machine.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// The VM's init: boots what the guest needs, then serves hako over the
/// port. Says why on the console when it cannot.
pub fn main_vm() -> GuestExit {
    match boot() {
        Ok(port) => {
            let Ok(output) = port.try_clone() else {
                eprintln!("hako-guest: cannot duplicate the port's descriptor");
                return GuestExit::Handshake;
            };
            if hako_sys::stdio_to_null().is_err() {
                return GuestExit::Handshake;
            }
            serve_link(server::Link::pipes(port, output))
        }
        Err(why) => {
            eprintln!("hako-guest: cannot start the VM's guest: {why}");
            GuestExit::Failed
        }
    }
}

fn boot() -> Result<OwnedFd, String> {
    use hako_sys::mount::{mount, MS_NODEV, MS_NOEXEC, MS_NOSUID};
    let mounts: [(&str, &str, hako_sys::mount::Flags, Option<&str>); 5] = [
        ("devtmpfs", "/dev", MS_NOSUID | MS_NOEXEC, Some("mode=0755")),
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
    load_modules()?;
    let port = wait_for_port()?;
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

/// The device of the port named [`PORT_NAME`], once its driver made it.
fn wait_for_port() -> Result<PathBuf, String> {
    let start = Instant::now();
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for entry in entries.flatten() {
                let name = std::fs::read_to_string(entry.path().join("name")).unwrap_or_default();
                let dev = Path::new("/dev").join(entry.file_name());
                if name.trim() == PORT_NAME && dev.exists() {
                    return Ok(dev);
                }
            }
        }
        if start.elapsed() > PORT_WAIT {
            return Err(format!(
                "no virtio-serial port named {PORT_NAME} after {}s",
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
