//! A vm sandbox: QEMU booting the image's kernel and initramfs, the guest
//! as init, reached over a virtio-serial port that is QEMU's stdio.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use hako_container::runner::Runner;
use hako_container::{base_env, ContainerLauncher};
use hako_core::{
    Capabilities, Error, Isolation, LimitKind, LimitMechanism, LimitReport, NetworkAccess, Result,
    SandboxSpec,
};
use hako_driver::sandbox::{common_limits, open_workspace, GuestConfig, GuestSandbox, OPTIONAL};
use hako_driver::LaunchOptions;

use crate::accel::{self, Accelerator};
use crate::image;
use crate::{NAME, QEMU_VAR};

/// The guest's memory when `--memory` is not given, MiB.
pub const DEFAULT_MEMORY_MIB: u64 = 512;
/// The least memory a VM boots with, MiB (the kernel and the initramfs).
pub const MIN_MEMORY_MIB: u64 = 128;
/// Where the workspace is inside the guest.
pub const WORKSPACE_INSIDE: &str = "/workspace";

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
    /// Runs QEMU (tests may record instead).
    pub runner: Arc<dyn Runner>,
}

impl VmConfig {
    /// A vm sandbox as `spec` describes, launched with the defaults.
    pub fn from_spec(spec: SandboxSpec) -> Self {
        VmConfig {
            spec,
            launch: LaunchOptions::default(),
            image: None,
            qemu: None,
            runner: Arc::new(crate::QemuRunner),
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

/// The machine and the virtio-serial device for an accelerator: with KVM,
/// the `microvm` machine (no PCI bus, no firmware beyond qboot, virtio
/// over MMIO; the guest's clock is kvmclock). With TCG, the `pc` machine
/// (virtio over PCI): `microvm` has neither HPET nor the ACPI PM timer, and
/// on a loaded host the emulated kernel's calibration of its TSC against
/// the PIT fails, after which its clock stands still and the boot hangs;
/// `pc`'s HPET gives it a reference.
pub fn machine(accel: Accelerator) -> (&'static str, &'static str) {
    match accel {
        Accelerator::Kvm => ("microvm,rtc=on", "virtio-serial-device"),
        Accelerator::Tcg => ("pc", "virtio-serial-pci"),
    }
}

/// QEMU's command line: the [`machine`], no default device (no VGA,
/// floppy, CD-ROM, parallel port or monitor), no NIC, no display; the
/// guest's link a virtio-serial port on QEMU's stdio; the console (the
/// kernel's messages) on QEMU's stderr; QEMU's own seccomp sandbox with
/// every optional denial on.
pub fn qemu_argv(plan: &QemuPlan) -> Vec<String> {
    let mut argv: Vec<String> = vec![plan.qemu.display().to_string()];
    let mut push = |items: &[&str]| argv.extend(items.iter().map(|s| s.to_string()));
    let (machine, serial) = machine(plan.accel);
    push(&[
        "-M",
        machine,
        "-accel",
        plan.accel.name(),
        "-cpu",
        if plan.accel.is_hardware() {
            "host"
        } else {
            "max"
        },
    ]);
    let memory = format!("{}M", plan.memory_mib);
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
    push(&[
        "-append",
        "console=ttyS0 quiet panic=-1 rdinit=/.hako-guest -- --vm",
    ]);
    push(&[
        "-chardev",
        "file,id=console,path=/dev/stderr",
        "-serial",
        "chardev:console",
        "-chardev",
        "stdio,id=hako,signal=off",
        "-device",
        serial,
        "-device",
        "virtserialport,chardev=hako,name=hako",
    ]);
    argv
}

/// A sandbox whose commands run in a virtual machine of their own.
#[derive(Debug)]
pub struct VmSandbox {
    inner: GuestSandbox,
    accel: Accelerator,
}

hako_driver::delegate_sandbox!(VmSandbox, inner);

impl VmSandbox {
    /// Boots the VM and waits for its guest.
    pub fn new(config: VmConfig) -> Result<Self> {
        let spec = &config.spec;
        if let Some(policy) = &spec.network {
            if policy.mode != hako_core::NetMode::None {
                return Err(backend_err(
                    "set up the network",
                    "the vm backend has no network yet (no NIC); use --net none",
                ));
            }
        }
        for (flag, given) in [
            ("--cow", spec.cow.is_some()),
            ("--image", spec.image.is_some()),
            ("--ro/--rw", !spec.ro.is_empty() || !spec.rw.is_empty()),
        ] {
            if given {
                return Err(backend_err(
                    "open",
                    format!("{flag} is not supported by the vm backend yet"),
                ));
            }
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
        let unenforced: Vec<&str> = [
            ("--pids", limits.pids.is_some()),
            ("--max-file-size", limits.file_size.is_some()),
            ("--max-open-files", limits.open_files.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if !unenforced.is_empty() && !spec.best_effort {
            return Err(backend_err(
                "apply limits",
                format!(
                    "{} not enforced by the vm backend yet (--memory and --cpus size the VM); drop them or pass --best-effort",
                    unenforced.join(", ")
                ),
            ));
        }
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
            network: NetworkAccess::None,
            fence: fence.resolver(),
            limits: {
                let mut reports = common_limits(spec.max_output, &fence);
                // The VM's size bounds the whole guest; the others are
                // refused above, or dropped with --best-effort.
                // What the VM gets, which may be more than asked (its
                // least memory, whole virtual CPUs).
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
            seccomp: true,
            shared: Vec::new(),
            defects,
            optional: OPTIONAL,
        };
        let launcher = ContainerLauncher {
            backend: NAME,
            program: "qemu",
            runner: Arc::clone(&config.runner),
            name: hako_container::unique_name("hako-vm"),
            argv: qemu_argv(&plan),
            workspace: PathBuf::from(WORKSPACE_INSIDE),
            cleanup: Vec::new(),
            keep: Mutex::new(Vec::new()),
            network: None,
            seal: None,
            memory: None,
            self_cleaning: false,
        };
        let inner = GuestSandbox::new(GuestConfig {
            backend: NAME,
            fence,
            caps,
            base_env: base_env(&spec.env),
            guest: None,
            max_output: spec.max_output,
            idle_timeout: config.launch.idle_timeout,
            driver: config.launch.driver.clone(),
            launcher: Box::new(launcher),
            proxy: None,
        })?;
        Ok(VmSandbox {
            inner,
            accel: detected.accel,
        })
    }

    /// The accelerator the VM runs on.
    pub fn accelerator(&self) -> Accelerator {
        self.accel
    }
}
