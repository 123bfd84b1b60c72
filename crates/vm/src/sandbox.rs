//! A vm sandbox: QEMU booting the image's kernel and initramfs, the guest
//! as init, reached over a virtio-serial port that is QEMU's stdio.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hako_container::base_env;
use hako_core::{
    Capabilities, CowLayers, Error, Isolation, LimitKind, LimitMechanism, LimitReport, Result,
    SandboxSpec,
};
use hako_driver::sandbox::{common_limits, open_workspace, GuestConfig, GuestSandbox, OPTIONAL};
use hako_driver::LaunchOptions;
use hako_fence::Fence;
use hako_sys::detached::DetachedMount;

use crate::accel::{self, Accelerator};
use crate::image;
use crate::launcher::{Held, ShareSpec, StartReport, VmLauncher};
use crate::{NAME, QEMU_VAR};
use hako_proto::{MemoryWatch, Seal};

/// The guest's memory when `--memory` is not given, MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 512;
/// The least memory a VM boots with, MiB (the kernel and the initramfs).
pub const MIN_MEMORY_MIB: u64 = 128;
/// What a share may not cover inside the guest (be, or be above): the
/// initramfs's programs and the guest's own files, and the kernel's
/// filesystems.
const COVERED_NEVER: &[&str] = &[
    "/bin",
    "/dev",
    "/etc",
    "/lib",
    "/lib64",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
    "/.hako-guest",
];
/// Where a share may not be mounted at all (the kernel's filesystems).
const BENEATH_NEVER: &[&str] = &["/dev", "/proc", "/sys"];

/// Whether `inside` may be a share's mount point in the guest (it is the
/// host path: the workspace and binds are where they are on the host).
fn mountable_inside(inside: &Path) -> bool {
    inside != Path::new("/")
        && !COVERED_NEVER
            .iter()
            .any(|r| Path::new(r).starts_with(inside))
        && !BENEATH_NEVER.iter().any(|r| inside.starts_with(r))
}

/// The overlay a copy-on-write workspace is seen through, with the
/// sandbox's layers (see [`hako_sys::detached`]).
fn cow_view(workspace: &Path, cow: &CowLayers) -> Result<Arc<DetachedMount>> {
    DetachedMount::overlay(workspace, &cow.upper, &cow.work)
        .map(Arc::new)
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (the vm backend mounts the overlay on the host, which needs root: run hako as root, or use --backend linux)"
            } else {
                ""
            };
            backend_err(
                "mount the copy-on-write workspace",
                format!(
                    "cannot mount an overlay of {} and its layers: {e}{hint}",
                    workspace.display()
                ),
            )
        })
}

/// The plan of a VM of the default size on `image`, as `hako bench`
/// measures it.
pub fn default_plan(image: Option<&Path>) -> Result<QemuPlan> {
    let dir = image_dir(image)?;
    Ok(QemuPlan {
        qemu: qemu_path(None),
        kernel: dir.join(image::KERNEL_FILE),
        initrd: dir.join(image::INITRD_FILE),
        accel: accel::detect().accel,
        memory_mib: DEFAULT_MEMORY_MIB,
        cpus: 1,
    })
}

/// How a vm sandbox is set up.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// The sandbox (the one spec every backend is opened from).
    pub spec: SandboxSpec,
    /// The fence's settings, the idle lease and the driver's options.
    pub launch: LaunchOptions,
    /// The image's directory (kernel, initramfs); `None` is
    /// `$HAKO_VM_IMAGE`, else [`image::default_dir`].
    pub image: Option<PathBuf>,
    /// The QEMU binary; `None` is `$HAKO_QEMU`, else `qemu-system-x86_64`.
    pub qemu: Option<PathBuf>,
    /// Start from (and keep) a snapshot of an idle VM of the same shape
    /// (see [`snapshot_path`]); `false` boots every VM.
    pub snapshots: bool,
}

impl VmConfig {
    /// A vm sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        VmConfig {
            spec,
            launch: LaunchOptions::default(),
            image: None,
            qemu: None,
            snapshots: true,
        }
    }
}

fn backend_err(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: NAME.into(),
        op,
        message: message.into(),
    }
}

/// The QEMU to run.
pub fn qemu_path(configured: Option<&Path>) -> PathBuf {
    configured
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(QEMU_VAR).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("qemu-system-x86_64"))
}

/// The image's directory, checked to hold a kernel and an initramfs.
pub fn image_dir(configured: Option<&Path>) -> Result<PathBuf> {
    let dir = match configured
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(crate::IMAGE_VAR).map(PathBuf::from))
    {
        Some(d) => d,
        None => image::default_dir().ok_or_else(|| {
            backend_err(
                "find the guest image",
                "neither XDG_DATA_HOME nor HOME is set",
            )
        })?,
    };
    for file in [image::KERNEL_FILE, image::INITRD_FILE] {
        if !dir.join(file).is_file() {
            return Err(backend_err(
                "find the guest image",
                format!(
                    "{} has no {file}; build the image with `hako vm build`",
                    dir.display()
                ),
            ));
        }
    }
    Ok(dir)
}

/// What QEMU is started with.
#[derive(Debug, Clone)]
pub struct QemuPlan {
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// The accelerator.
    pub accel: Accelerator,
    /// Guest memory, MiB.
    pub memory_mib: u64,
    /// Virtual CPUs.
    pub cpus: u64,
}

/// The kernel's command line before its init, the same for a sandbox's
/// VM and the bare boot `hako bench` compares it with: the console on the
/// first serial port, quiet, a panic ends the VM, and PCI interrupts
/// routed by the BIOS's table rather than by ACPI's interpreter (which,
/// emulated, takes over 100 ms to route the first device's, the
/// virtio-serial port's; its devices use MSI-X).
const KERNEL_ARGS: &str = "console=ttyS0 quiet panic=-1 acpi=noirq";

/// QEMU's command line: the `pc` machine under either accelerator (its
/// PCI bus takes the shares' virtio-fs devices once the VM runs, which is
/// what lets a VM start from a snapshot; `microvm` has no hotplug, and
/// under TCG neither HPET nor the ACPI PM timer, without which the emulated
/// kernel's clock calibration fails on a loaded host); guest memory the
/// jail's RAM file, shared (virtio-fs's daemon maps it); no default device (no VGA,
/// floppy, CD-ROM, parallel port or monitor), no NIC, no display; QMP on
/// descriptor 3 (one end of a socket pair hako holds the other end of);
/// the guest's link a virtio-serial port on QEMU's stdio; the console (the
/// kernel's messages) on a socket at descriptor 4; QEMU's own seccomp sandbox with
/// every optional denial on. QEMU itself runs in [`crate::jail`].
pub fn qemu_argv(plan: &QemuPlan) -> Vec<String> {
    let mut argv: Vec<String> = vec![plan.qemu.display().to_string()];
    let mut push = |items: &[&str]| argv.extend(items.iter().map(|s| s.to_string()));
    let memory = format!("{}M", plan.memory_mib);
    let backend = format!(
        "memory-backend-file,id=mem,size={memory},share=on,mem-path={}",
        hako_sys::jail::RAM_FILE
    );
    push(&[
        "-M",
        "pc,memory-backend=mem",
        "-object",
        &backend,
        "-accel",
        plan.accel.name(),
        "-cpu",
        if plan.accel.is_hardware() {
            "host"
        } else {
            "max"
        },
    ]);
    let cpus = plan.cpus.to_string();
    push(&["-m", &memory, "-smp", &cpus]);
    push(&[
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-nic",
        "none",
        "-no-reboot",
        "-sandbox",
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny",
    ]);
    let kernel = plan.kernel.display().to_string();
    let initrd = plan.initrd.display().to_string();
    push(&["-kernel", &kernel, "-initrd", &initrd]);
    let append = format!("{KERNEL_ARGS} rdinit=/.hako-guest -- --vm");
    push(&["-append", &append]);
    push(&[
        "-chardev",
        "socket,id=qmp,fd=3",
        "-mon",
        "chardev=qmp,mode=control",
        // The console on a socket at descriptor 4, hako's to read (the
        // jail has no /proc to find /dev/stderr through, and QEMU takes
        // no standard stream as a descriptor of its own).
        "-chardev",
        "socket,id=console,fd=4",
        "-serial",
        "chardev:console",
        "-chardev",
        "stdio,id=hako,signal=off",
        "-device",
        "virtio-serial-pci,id=vser",
        "-device",
        "virtserialport,chardev=hako,name=hako,id=hako",
    ]);
    argv
}

/// The reference `hako bench` measures a cold start against: QEMU booting
/// the same kernel and initramfs on the same machine, memory and
/// accelerator to a trivial init (`/bin/true`, whose exit ends the VM),
/// with no device of hako's.
pub fn bare_boot_argv(plan: &QemuPlan) -> Vec<String> {
    let mut argv = qemu_argv(plan);
    // Not jailed: the same memory, as a memfd rather than the jail's file.
    for arg in argv.iter_mut() {
        if arg.starts_with("memory-backend-file,") {
            *arg = format!(
                "memory-backend-memfd,id=mem,size={}M,share=on",
                plan.memory_mib
            );
        }
    }
    // Up to the kernel's command line, which is the last thing in common.
    let cut = argv
        .iter()
        .position(|a| a == "-append")
        .map_or(argv.len(), |i| i + 1);
    argv.truncate(cut);
    argv.extend([
        format!("{KERNEL_ARGS} rdinit=/bin/true"),
        "-serial".into(),
        "none".into(),
    ]);
    argv
}

/// Where the snapshot of an idle VM of this command line is kept: under
/// the image's directory, named after a hash of the command line, the
/// kernel's, initramfs's and QEMU's identity (size and modification
/// time), so that a new image or QEMU never restores an old state.
pub fn snapshot_path(image: &Path, argv: &[String], plan: &QemuPlan) -> Option<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    argv.hash(&mut hasher);
    let qemu = which(&plan.qemu)?;
    for file in [&plan.kernel, &plan.initrd, &qemu] {
        let meta = std::fs::metadata(file).ok()?;
        file.hash(&mut hasher);
        meta.len().hash(&mut hasher);
        meta.modified().ok()?.hash(&mut hasher);
    }
    Some(
        image
            .join(SNAPSHOTS_DIR)
            .join(format!("{:016x}.state", hasher.finish())),
    )
}

/// The directory of an image's snapshots.
pub const SNAPSHOTS_DIR: &str = "snapshots";

/// A program's path, looked up in `PATH` when it has no directory.
pub(crate) fn which(program: &Path) -> Option<PathBuf> {
    if program.components().count() > 1 {
        return Some(program.to_path_buf());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// A sandbox whose commands run in a virtual machine of their own.
#[derive(Debug)]
pub struct VmSandbox {
    inner: GuestSandbox,
    accel: Accelerator,
    held: Arc<Mutex<Held>>,
}

hako_driver::delegate_sandbox!(VmSandbox, inner);

impl VmSandbox {
    /// Boots the VM and waits for its guest.
    pub fn new(config: VmConfig) -> Result<Self> {
        let spec = &config.spec;
        let network = hako_driver::network::NetworkSetup::new(
            &spec
                .network
                .clone()
                .unwrap_or_else(hako_core::NetworkPolicy::none),
        )?;
        if network.mode == hako_core::NetMode::Host {
            return Err(network.unavailable(
                NAME,
                "a vm sandbox has no NIC; use --net allow (through the egress proxy) or --net none",
            ));
        }
        if spec.image.is_some() {
            return Err(backend_err(
                "open",
                "--image applies only to --backend docker and gvisor; a vm sandbox's commands run on its guest image (`hako vm build`)",
            ));
        }
        let detected = accel::detect();
        if !detected.accel.is_hardware()
            && spec.min_isolation >= Isolation::Vm
            && !spec.allow_emulated_vm
        {
            return Err(backend_err(
                "check the isolation",
                format!(
                    "refused: --min-isolation vm asks for a hardware boundary, and this VM would be emulated (accelerator tcg: {}); QEMU does not count TCG as a security boundary; pass --allow-emulated-vm to accept it",
                    detected.why.clone().unwrap_or_default()
                ),
            ));
        }
        let limits = spec.limits;
        let fence = open_workspace(&spec.workspace, &config.launch.fence)?;
        let dir = image_dir(config.image.as_deref())?;
        let memory_mib = limits
            .memory
            .map(|b| (b >> 20).max(MIN_MEMORY_MIB))
            .unwrap_or(DEFAULT_MEMORY_MIB);
        let cpus = limits
            .cpus_milli
            .map(|m| m.div_ceil(1000).max(1))
            .unwrap_or(1);
        let plan = QemuPlan {
            qemu: qemu_path(config.qemu.as_deref()),
            kernel: dir.join(image::KERNEL_FILE),
            initrd: dir.join(image::INITRD_FILE),
            accel: detected.accel,
            memory_mib,
            cpus,
        };
        let virtiofsd = crate::virtiofs::find().ok_or_else(|| {
            backend_err(
                "share the workspace",
                format!(
                    "virtiofsd is not installed (the vm backend shares the workspace with it); install it (`cargo install virtiofsd`, or your distribution's package) beside hako or on PATH, or set {}",
                    crate::virtiofs::VIRTIOFSD_VAR
                ),
            )
        })?;
        let workspace = fence.workdir().to_path_buf();
        if !mountable_inside(&workspace) {
            return Err(backend_err(
                "share the workspace",
                format!(
                    "{} cannot be the workspace of a vm sandbox: it is shared at the same path inside, where it would cover the guest's system directories",
                    workspace.display()
                ),
            ));
        }
        // With --cow, the commands and the fence see the workspace through
        // an overlay with the sandbox's upper layer, never the workspace
        // itself: mounted apart from every namespace, its clone served by
        // the workspace's virtiofsd, the fence on the original.
        let view = spec
            .cow
            .as_ref()
            .map(|cow| cow_view(&workspace, cow))
            .transpose()?;
        let fence = match &view {
            None => fence,
            Some(view) => Fence::open_as(&view.path(), &workspace, config.launch.fence.clone())
                .map_err(|e| backend_err("open the layered view", e.to_string()))?,
        };
        let mut shares = vec![ShareSpec {
            host: workspace.clone(),
            inside: workspace.clone(),
            read_only: false,
            view,
        }];
        for (list, read_only) in [(&spec.ro, true), (&spec.rw, false)] {
            for dir in list {
                let host = dir.canonicalize().map_err(|e| {
                    backend_err("share a directory", format!("{}: {e}", dir.display()))
                })?;
                if !host.is_dir() {
                    return Err(backend_err(
                        "share a directory",
                        format!(
                            "{} is not a directory (the vm backend shares directories)",
                            host.display()
                        ),
                    ));
                }
                if !mountable_inside(&host)
                    || workspace.starts_with(&host)
                    || host.starts_with(&workspace)
                {
                    return Err(backend_err(
                        "share a directory",
                        format!("{} cannot be shared with a vm sandbox: it would cover the guest's system directories or the workspace, or lie inside it", host.display()),
                    ));
                }
                shares.push(ShareSpec {
                    inside: host.clone(),
                    host,
                    read_only,
                    view: None,
                });
            }
        }
        let mut defects = Vec::new();
        if !detected.accel.is_hardware() {
            defects.push(format!(
                "accelerator tcg: {}",
                detected.why.clone().unwrap_or_default()
            ));
        }
        let caps = Capabilities {
            backend: NAME.into(),
            isolation: Isolation::Vm,
            network: network.access,
            fence: fence.resolver(),
            limits: {
                let mut reports = common_limits(spec.max_output, &fence);
                // The VM's size bounds the whole guest: what the VM gets,
                // which may be more than asked (its least memory, whole
                // virtual CPUs). Processes are counted by a cgroup of the
                // guest's kernel (the seal's), file sizes and descriptors
                // by rlimits set on the guest's pid 1.
                reports.extend(
                    hako_driver::sandbox::resource_limit_reports(
                        &limits,
                        LimitMechanism::SandboxKernel,
                    )
                    .into_iter()
                    .filter(|r| !matches!(r.kind, LimitKind::Memory | LimitKind::Cpus)),
                );
                let sized = [
                    (LimitKind::Memory, limits.memory.map(|_| memory_mib << 20)),
                    (LimitKind::Cpus, limits.cpus_milli.map(|_| cpus * 1000)),
                ];
                reports.extend(sized.into_iter().filter_map(|(kind, value)| {
                    value.map(|v| LimitReport {
                        kind,
                        value: Some(v),
                        mechanism: LimitMechanism::VmSize,
                    })
                }));
                reports
            },
            env_sanitised: true,
            fds_closed: true,
            landlock_abi: None,
            accelerator: Some(detected.accel.name().to_string()),
            seccomp: true,
            shared: Vec::new(),
            defects,
            optional: OPTIONAL,
        };
        let argv = qemu_argv(&plan);
        let jail = crate::jail::for_qemu(&plan)
            .map_err(|e| backend_err("jail QEMU", format!("cannot work out QEMU's jail: {e}")))?;
        let snapshot = if config.snapshots {
            snapshot_path(&dir, &argv, &plan)
        } else {
            None
        };
        let held = Arc::new(Mutex::new(Held::default()));
        let launcher = Box::new(VmLauncher {
            vmm: Box::new(crate::qemu::Qemu {
                argv,
                jail: Arc::new(jail),
            }),
            snapshot,
            shares,
            virtiofsd,
            workspace,
            net: match (network.socket_dir(), &network.spec) {
                (Some(dir), Some(spec)) => Some(crate::launcher::NetLink {
                    proxy: dir.join(hako_net::SOCKET_NAME),
                    spec: spec.clone(),
                }),
                _ => None,
            },
            file_size: limits.file_size,
            open_files: limits.open_files,
            seal: Some(Seal {
                mask_files: Vec::new(),
                // The guest's descriptors (its port among them), as under
                // gVisor; a second open of the port itself is refused by
                // the kernel (one opener a port).
                mask_dirs: hako_proto::GUEST_FD_DIRS
                    .iter()
                    .map(PathBuf::from)
                    .collect(),
                seccomp: true,
                guard: true,
                pids_max: limits.pids,
            }),
            // The guest's kernel kills past the VM's memory and counts it.
            memory: limits
                .memory
                .map(|_| MemoryWatch::Counter(vec![PathBuf::from("/proc/vmstat")])),
            held: Arc::clone(&held),
        });
        let mut env = base_env(&spec.env);
        network.apply_env(&mut env);
        let inner = GuestSandbox::new(GuestConfig {
            backend: NAME,
            fence,
            caps,
            base_env: env,
            guest: None,
            max_output: spec.max_output,
            idle_timeout: config.launch.idle_timeout,
            driver: config.launch.driver.clone(),
            launcher,
            proxy: network.proxy,
        })?;
        Ok(VmSandbox {
            inner,
            accel: detected.accel,
            held,
        })
    }

    /// The accelerator the VM runs on.
    pub fn accelerator(&self) -> Accelerator {
        self.accel
    }

    /// How the VM was started (booted or restored) and how long it took.
    pub fn start_report(&self) -> Option<StartReport> {
        self.held.lock().ok()?.started
    }
}
