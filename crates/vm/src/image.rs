//! The guest image: a kernel and an initramfs, built from Debian's
//! `linux-image-cloud-amd64` (`hako vm build`), never from the host's
//! `/boot`.
//!
//! The package is fetched with `apt-get download` and unpacked with
//! `dpkg -x` into a cache under the image's directory. Its virtio, virtio-fs
//! and overlay drivers are modules: the ones the guest needs
//! ([`MODULES`]) are copied into the initramfs with every module they
//! depend on (read from each module's own `depends=`, since the package
//! carries no `modules.dep`), listed in load order for the init. The
//! initramfs is a busybox root (the same as the container images') with
//! the static guest as `/.hako-guest`, which the kernel starts as its init
//! (`rdinit=`).

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use hako_core::{Error, Result};

/// The Debian package whose kernel the image boots.
pub const KERNEL_PACKAGE: &str = "linux-image-cloud-amd64";
/// The modules the guest loads (with what they depend on): the virtio-pci
/// transport (the VM is QEMU's `pc` machine), the serial port hako's link
/// runs over, and virtio-fs. Each costs boot time (tens of milliseconds
/// under TCG), so nothing more.
pub const MODULES: &[&str] = &["virtio_pci", "virtio_console", "virtiofs"];
/// The kernel's file in an image's directory.
pub const KERNEL_FILE: &str = "vmlinuz";
/// The initramfs's file in an image's directory.
pub const INITRD_FILE: &str = "initramfs.cpio";
/// The file holding the kernel's release (what `uname -r` prints inside).
pub const RELEASE_FILE: &str = "release";
/// The guest's path inside the initramfs (also a name the guest answers to).
pub const GUEST_INSIDE: &str = ".hako-guest";

fn failed(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: crate::NAME.into(),
        op,
        message: message.into(),
    }
}

/// Where the image is kept: `$XDG_DATA_HOME/hako/vm`, else
/// `~/.local/share/hako/vm`.
pub fn default_dir() -> Option<PathBuf> {
    hako_container::image::default_dir("vm")
        .and_then(|d| d.parent()?.parent().map(|p| p.join("vm")))
}

/// What an image is built from.
#[derive(Debug, Clone)]
pub struct BuildSpec {
    /// The directory the image is written to (its kernel, initramfs and
    /// release; the package cache under `cache/`).
    pub dir: PathBuf,
    /// A kernel of the user's in place of Debian's (for example one with
    /// PVM guest support); its drivers must then be built in, or be in
    /// `initrd`.
    pub kernel: Option<PathBuf>,
    /// An initramfs of the user's, used as it is (it must start the guest
    /// with `--vm`).
    pub initrd: Option<PathBuf>,
    /// The static guest.
    pub guest: PathBuf,
    /// A statically linked busybox for the root's tools.
    pub busybox: PathBuf,
}

/// What [`build`] made.
#[derive(Debug, Clone)]
pub struct Built {
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// The kernel's release, when known.
    pub release: Option<String>,
    /// The modules the initramfs loads, in order.
    pub modules: Vec<String>,
}

/// Builds the image into `spec.dir`.
pub fn build(spec: &BuildSpec) -> Result<Built> {
    let io = |op: &'static str| move |e: std::io::Error| failed(op, e.to_string());
    std::fs::create_dir_all(&spec.dir).map_err(io("create the image's directory"))?;
    let (kernel_src, release, modules_dir) = match &spec.kernel {
        Some(kernel) => (kernel.clone(), None, None),
        None => {
            let unpacked = fetch_kernel(&spec.dir.join("cache"))?;
            (
                unpacked.kernel,
                Some(unpacked.release),
                Some(unpacked.modules),
            )
        }
    };
    let kernel = spec.dir.join(KERNEL_FILE);
    copy_atomically(&kernel_src, &kernel).map_err(io("copy the kernel"))?;
    let initrd = spec.dir.join(INITRD_FILE);
    let mut loaded = Vec::new();
    match &spec.initrd {
        Some(given) => copy_atomically(given, &initrd).map_err(io("copy the initramfs"))?,
        None => {
            let modules = match &modules_dir {
                Some(dir) => resolve_modules(dir, MODULES)?,
                None => Vec::new(),
            };
            loaded = modules
                .iter()
                .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
                .collect();
            write_initramfs(spec, &modules, &initrd)?;
        }
    }
    let release_path = spec.dir.join(RELEASE_FILE);
    match &release {
        Some(r) => {
            std::fs::write(&release_path, format!("{r}\n")).map_err(io("write the release"))?
        }
        None => {
            let _ = std::fs::remove_file(&release_path);
        }
    }
    Ok(Built {
        kernel,
        initrd,
        release,
        modules: loaded,
    })
}

fn copy_atomically(from: &Path, to: &Path) -> std::io::Result<()> {
    let tmp = to.with_extension("new");
    std::fs::copy(from, &tmp)?;
    std::fs::rename(&tmp, to)
}

struct Unpacked {
    kernel: PathBuf,
    release: String,
    modules: PathBuf,
}

fn run(op: &'static str, cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .map_err(|e| failed(op, format!("cannot run {:?}: {e}", cmd.get_program())))?;
    if !out.status.success() {
        return Err(failed(
            op,
            format!(
                "{:?} failed: {}",
                cmd.get_program(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Downloads and unpacks the kernel's package (the one the meta-package
/// depends on) into `cache`, once per version.
fn fetch_kernel(cache: &Path) -> Result<Unpacked> {
    let deps = run(
        "find the kernel's package",
        Command::new("apt-cache").args(["depends", KERNEL_PACKAGE]),
    )?;
    let package = deps
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-"))
        .ok_or_else(|| {
            failed(
                "find the kernel's package",
                format!("{KERNEL_PACKAGE} depends on no linux-image package (apt-cache depends)"),
            )
        })?
        .to_string();
    let release = package.trim_start_matches("linux-image-").to_string();
    let unpacked = cache.join(&package);
    let done = unpacked.join(".hako-unpacked");
    if !done.exists() {
        std::fs::create_dir_all(cache).map_err(|e| failed("download the kernel", e.to_string()))?;
        run(
            "download the kernel",
            Command::new("apt-get")
                .args(["download", "-q", &package])
                .current_dir(cache),
        )?;
        let deb = std::fs::read_dir(cache)
            .map_err(|e| failed("download the kernel", e.to_string()))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")) && n.ends_with(".deb"))
            })
            .ok_or_else(|| {
                failed(
                    "download the kernel",
                    format!("apt-get left no {package} .deb"),
                )
            })?;
        let _ = std::fs::remove_dir_all(&unpacked);
        run(
            "unpack the kernel",
            Command::new("dpkg").arg("-x").arg(&deb).arg(&unpacked),
        )?;
        let _ = std::fs::remove_file(&deb);
        std::fs::write(&done, "").map_err(|e| failed("unpack the kernel", e.to_string()))?;
    }
    let kernel = unpacked.join("boot").join(format!("vmlinuz-{release}"));
    let modules = unpacked.join("lib/modules").join(&release);
    if !kernel.is_file() || !modules.is_dir() {
        return Err(failed(
            "unpack the kernel",
            format!("{package} has no boot/vmlinuz-{release} or lib/modules/{release}"),
        ));
    }
    Ok(Unpacked {
        kernel,
        release,
        modules,
    })
}

/// A module's name as the kernel knows it (`-` and `_` are the same).
fn module_name(file: &str) -> Option<String> {
    file.strip_suffix(".ko").map(|n| n.replace('-', "_"))
}

/// Every `.ko` under `dir`, by name.
fn index_modules(dir: &Path, found: &mut BTreeMap<String, PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            index_modules(&path, found)?;
        } else if let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(module_name)
        {
            found.insert(name, path);
        }
    }
    Ok(())
}

/// The `depends=` of a module's `.modinfo` (its strings are NUL-separated).
fn depends(module: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    let Some(at) = module.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let rest = &module[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .map(|d| d.trim().replace('-', "_"))
        .filter(|d| !d.is_empty())
        .collect()
}

/// The files of `wanted` and everything they depend on, each after its
/// dependencies. A module the kernel builds in (in `modules.builtin`) is
/// skipped; one that is neither is an error.
pub fn resolve_modules(dir: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>> {
    let mut index = BTreeMap::new();
    index_modules(&dir.join("kernel"), &mut index)
        .map_err(|e| failed("read the kernel's modules", e.to_string()))?;
    let builtin: BTreeSet<String> = std::fs::read_to_string(dir.join("modules.builtin"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.rsplit('/').next().and_then(module_name))
        .collect();
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        index: &BTreeMap<String, PathBuf>,
        builtin: &BTreeSet<String>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<PathBuf>,
    ) -> Result<()> {
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let Some(path) = index.get(name) else {
            if builtin.contains(name) {
                return Ok(());
            }
            return Err(failed(
                "resolve the kernel's modules",
                format!("the kernel has no module {name}, built in or not"),
            ));
        };
        let bytes = std::fs::read(path).map_err(|e| {
            failed(
                "resolve the kernel's modules",
                format!("{}: {e}", path.display()),
            )
        })?;
        for dep in depends(&bytes) {
            visit(&dep, index, builtin, seen, order)?;
        }
        order.push(path.clone());
        Ok(())
    }
    for name in wanted {
        visit(name, &index, &builtin, &mut seen, &mut order)?;
    }
    Ok(order)
}

/// Writes the initramfs: the busybox root, the guest, the modules and
/// their order, and `/dev/console`.
fn write_initramfs(spec: &BuildSpec, modules: &[PathBuf], to: &Path) -> Result<()> {
    let io = |op: &'static str| move |e: std::io::Error| failed(op, e.to_string());
    let root = tempfile::Builder::new()
        .prefix(".initramfs-")
        .tempdir_in(&spec.dir)
        .map_err(io("create the initramfs"))?;
    hako_container::image::build_rootfs(&hako_container::image::ImageSpec {
        busybox: spec.busybox.clone(),
        dir: root.path().to_path_buf(),
    })?;
    for dir in ["workspace", "run", "lib/modules/hako"] {
        std::fs::create_dir_all(root.path().join(dir)).map_err(io("create the initramfs"))?;
    }
    let guest = root.path().join(GUEST_INSIDE);
    std::fs::copy(&spec.guest, &guest).map_err(io("copy the guest"))?;
    std::fs::set_permissions(&guest, std::fs::Permissions::from_mode(0o755))
        .map_err(io("copy the guest"))?;
    let mut order = String::new();
    for module in modules {
        let name = module.file_name().unwrap_or_default();
        std::fs::copy(module, root.path().join("lib/modules/hako").join(name))
            .map_err(io("copy the modules"))?;
        order.push_str(&name.to_string_lossy());
        order.push('\n');
    }
    std::fs::write(root.path().join("lib/modules/hako/order"), order)
        .map_err(io("write the modules' order"))?;
    let tmp = to.with_extension("new");
    let file = std::fs::File::create(&tmp).map_err(io("write the initramfs"))?;
    let mut out = std::io::BufWriter::new(file);
    let mut cpio = Cpio::default();
    cpio.tree(&mut out, root.path(), Path::new(""))
        .map_err(io("write the initramfs"))?;
    // The console the kernel opens for init's stdio.
    cpio.entry(&mut out, "dev/console", 0o020600, (5, 1), &[])
        .map_err(io("write the initramfs"))?;
    cpio.entry(&mut out, "TRAILER!!!", 0, (0, 0), &[])
        .map_err(io("write the initramfs"))?;
    out.flush().map_err(io("write the initramfs"))?;
    drop(out);
    std::fs::rename(&tmp, to).map_err(io("write the initramfs"))?;
    Ok(())
}

/// A writer of the `newc` cpio format the kernel unpacks.
#[derive(Default)]
struct Cpio {
    ino: u32,
    written: u64,
}

impl Cpio {
    fn pad(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        out.write_all(&[0; 3][..pad])?;
        self.written += pad as u64;
        Ok(())
    }

    fn entry(
        &mut self,
        out: &mut impl Write,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> std::io::Result<()> {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let header = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        out.write_all(header.as_bytes())?;
        out.write_all(name.as_bytes())?;
        out.write_all(&[0])?;
        self.written += (header.len() + name.len() + 1) as u64;
        self.pad(out)?;
        out.write_all(data)?;
        self.written += data.len() as u64;
        self.pad(out)
    }

    /// `dir`'s entries, recursively, named under `prefix`; owned by root.
    fn tree(&mut self, out: &mut impl Write, dir: &Path, prefix: &Path) -> std::io::Result<()> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let name = prefix.join(entry.file_name());
            let text = name.to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&path)?;
            let perm = meta.mode() & 0o7777;
            let ft = meta.file_type();
            if ft.is_dir() {
                self.entry(out, &text, 0o040000 | perm, (0, 0), &[])?;
                self.tree(out, &path, &name)?;
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&path)?;
                let bytes = target.as_os_str().as_encoded_bytes();
                self.entry(out, &text, 0o120777, (0, 0), bytes)?;
            } else if ft.is_file() {
                let data = std::fs::read(&path)?;
                self.entry(out, &text, 0o100000 | perm, (0, 0), &data)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn depends_is_read_from_the_modinfo_strings() {
        let bytes = b"\x7fELF junk\0license=GPL\0depends=virtio,virtio_ring\0vermagic=6.1\0";
        assert_eq!(depends(bytes), ["virtio", "virtio_ring"]);
        assert!(depends(b"\0depends=\0").is_empty());
        assert!(depends(b"no modinfo here").is_empty());
    }

    #[test]
    fn a_missing_module_is_named() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("kernel/drivers")).unwrap();
        std::fs::write(dir.path().join("kernel/drivers/a.ko"), b"\0depends=b-c\0").unwrap();
        std::fs::write(dir.path().join("kernel/drivers/b-c.ko"), b"\0depends=\0").unwrap();
        let order = resolve_modules(dir.path(), &["a"]).unwrap();
        let names: Vec<_> = order
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["b-c.ko", "a.ko"]);
        let err = resolve_modules(dir.path(), &["nope"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no module nope"), "{err}");
    }
}
