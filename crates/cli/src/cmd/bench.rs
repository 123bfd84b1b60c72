//! `hako bench`: each backend against the reference tool, in the same run.
//!
//! Every figure is a median over many runs, and every hako figure is reported
//! with its reference measured in the same loop, one run of each in turn, as
//! a ratio (hako / reference): the ratio is what carries from one machine to
//! another, and alternating keeps the machine's drift out of it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use clap::Args;
use hako_core::{Command, Sandbox};
use serde::Serialize;

use hako_runtime::{BackendArg, BackendKind, SandboxSpec};

use super::BackendFlag;

/// Flags of `hako bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend to measure (repeatable) [default: host].
    #[arg(long, value_enum)]
    backend: Vec<BackendFlag>,
    /// Runs per measurement.
    #[arg(long, default_value_t = 50)]
    iterations: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Stats {
    median_us: f64,
    p90_us: f64,
}

fn measure(n: usize, mut f: impl FnMut() -> Result<(), String>) -> Result<Stats, String> {
    let n = n.max(1);
    // One untimed run warms caches and page tables.
    f()?;
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        f()?;
        samples.push(start.elapsed());
    }
    Ok(stats(samples))
}

/// Measures `a` and `b` alternately, so that the machine's drift during the
/// run (another VM, a frequency change) weighs on both alike; returns the
/// statistics of each.
fn measure_pair(
    n: usize,
    mut a: impl FnMut() -> Result<(), String>,
    mut b: impl FnMut() -> Result<(), String>,
) -> Result<(Stats, Stats), String> {
    let timed = |f: &mut dyn FnMut() -> Result<(), String>| {
        let start = Instant::now();
        f().map(|()| start.elapsed())
    };
    alternate(n, || timed(&mut a), || timed(&mut b))
}

/// [`measure_pair`] of runs that time themselves (each returns how long
/// the part measured took).
fn alternate(
    n: usize,
    mut a: impl FnMut() -> Result<Duration, String>,
    mut b: impl FnMut() -> Result<Duration, String>,
) -> Result<(Stats, Stats), String> {
    let n = n.max(1);
    a()?;
    b()?;
    let mut sa = Vec::with_capacity(n);
    let mut sb = Vec::with_capacity(n);
    for i in 0..n {
        // Alternate which goes first, too.
        if i % 2 == 0 {
            sa.push(a()?);
            sb.push(b()?);
        } else {
            sb.push(b()?);
            sa.push(a()?);
        }
    }
    Ok((stats(sa), stats(sb)))
}

fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Stats {
        median_us: us(at(0.5)),
        p90_us: us(at(0.9)),
    }
}

#[derive(Debug, Serialize)]
struct Comparison {
    /// The figure's plain name within its backend, e.g.
    /// `warm_exec.ratio_vs_fork_exec` (see [`Report::figures`]).
    figure: String,
    name: String,
    backend: Option<&'static str>,
    hako: Stats,
    reference: String,
    reference_stats: Stats,
    /// hako median / reference median: lower is better, 1.0 is parity.
    ratio: f64,
}

fn compare(
    figure: String,
    name: String,
    backend: Option<&'static str>,
    hako: Stats,
    reference: &str,
    reference_stats: Stats,
) -> Comparison {
    Comparison {
        figure,
        name,
        backend,
        hako,
        reference: reference.to_string(),
        ratio: hako.median_us / reference_stats.median_us.max(f64::MIN_POSITIVE),
        reference_stats,
    }
}

#[derive(Debug, Serialize)]
struct Reference {
    tool: String,
    stats: Option<Stats>,
    skipped: Option<String>,
}

/// Bytes moved per second, hako's path against the direct one.
#[derive(Debug, Serialize)]
struct Throughput {
    /// Plain name, as in [`Comparison::figure`].
    figure: String,
    name: String,
    backend: &'static str,
    bytes: u64,
    hako_mib_s: f64,
    reference: String,
    reference_mib_s: f64,
    /// hako's throughput / the reference's: higher is better, 1.0 is parity.
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    iterations: usize,
    /// How the measured `hako` was linked: `static` (as `scripts/build`
    /// links it), `dynamic`, or `unknown`. A dynamic one starts slower.
    linked: &'static str,
    /// Every ratio by backend and plain name (`cold_run.ratio_vs_bwrap`,
    /// `warm_exec.ratio_vs_fork_exec`, ...), for scripts.
    figures: std::collections::BTreeMap<String, std::collections::BTreeMap<String, f64>>,
    comparisons: Vec<Comparison>,
    throughput: Vec<Throughput>,
    references: Vec<Reference>,
    errors: Vec<String>,
}

fn status_ok(cmd: &mut std::process::Command) -> Result<(), String> {
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?}: {status}"))
    }
}

fn fork_exec_true(n: usize) -> Result<Stats, String> {
    measure(n, || status_ok(&mut std::process::Command::new("true")))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// The reference for the linux backend: bubblewrap with every namespace, a
/// read-only view of the host, a new /proc and a minimal /dev (it applies no
/// Landlock, no seccomp and no cgroup; hako's linux backend does).
const BWRAP: [&str; 12] = [
    "bwrap",
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/",
    "/",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "true",
    "",
];

fn references(n: usize) -> Vec<Reference> {
    let mut out = vec![Reference {
        tool: "fork/exec true".into(),
        stats: fork_exec_true(n).ok(),
        skipped: None,
    }];
    let bwrap = BWRAP[..11].join(" ");
    out.push(match find_in_path("bwrap") {
        Some(path) => {
            let run = || status_ok(std::process::Command::new(&path).args(&BWRAP[1..11]));
            match measure(n, run) {
                Ok(stats) => Reference {
                    tool: bwrap,
                    stats: Some(stats),
                    skipped: None,
                },
                Err(e) => Reference {
                    tool: bwrap,
                    stats: None,
                    skipped: Some(e),
                },
            }
        }
        None => Reference {
            tool: bwrap,
            stats: None,
            skipped: Some("bwrap is not installed".into()),
        },
    });
    out
}

/// A running container of the default image, kept for `docker exec`
/// measurements (what a harness that runs each call through `docker exec`
/// pays); removed on drop.
struct ReferenceContainer {
    name: String,
}

impl ReferenceContainer {
    fn start(runtime: Option<&str>) -> Result<ReferenceContainer, String> {
        let name = format!(
            "hako-bench-ref-{}-{}",
            std::process::id(),
            runtime.unwrap_or("default")
        );
        let runtime_args: Vec<&str> = runtime.map(|r| vec!["--runtime", r]).unwrap_or_default();
        status_ok(
            std::process::Command::new("docker")
                .args(["run", "--detach", "--rm", "--init", "--network", "none"])
                .args(&runtime_args)
                .args([
                    "--name",
                    &name,
                    "--entrypoint",
                    "sleep",
                    &default_image(),
                    "100000",
                ]),
        )
        .map_err(|e| format!("cannot start a reference container: {e}"))?;
        Ok(ReferenceContainer { name })
    }

    fn exec_true(&self) -> Result<(), String> {
        status_ok(std::process::Command::new("docker").args(["exec", &self.name, "true"]))
    }
}

impl Drop for ReferenceContainer {
    fn drop(&mut self) {
        let _ = status_ok(std::process::Command::new("docker").args(["rm", "--force", &self.name]));
    }
}

/// Runs `command` (`true`) in `sandbox`; an error unless it succeeded.
fn exec_true(sandbox: &dyn Sandbox, command: &Command) -> Result<(), String> {
    let out = sandbox.exec(command).map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("true exited {:?}", out.status))
    }
}

fn default_image() -> String {
    format!("{}:latest", hako_container::image::DEFAULT_NAME)
}

/// `runtime`: for `docker`, the OCI runtime (`runsc`), measured as a
/// backend of its own (`docker+runsc`).
fn bench_backend(
    kind: BackendKind,
    runtime: Option<&str>,
    n: usize,
    workspace: &Path,
    out: &mut Vec<Comparison>,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let label: &'static str = match runtime {
        Some(_) => "docker+runsc",
        None => kind.name(),
    };
    let runtime_args: Vec<&str> = runtime.map(|r| vec!["--runtime", r]).unwrap_or_default();
    let hako_run = || {
        status_ok(
            std::process::Command::new(&exe)
                .args(["run", "--backend", kind.name()])
                .args(&runtime_args)
                .arg("--workspace")
                .arg(workspace)
                .args(["--", "true"]),
        )
    };
    let fork_exec = || status_ok(&mut std::process::Command::new("true"));
    // Each backend against the tool it replaces, measured alternately.
    let (reference_name, reference_key, (cold, reference)) = match kind {
        BackendKind::Linux => {
            let bwrap = find_in_path("bwrap")
                .ok_or("bwrap is not installed (apt-get install bubblewrap)")?;
            let bwrap_true = || status_ok(std::process::Command::new(&bwrap).args(&BWRAP[1..11]));
            (
                BWRAP[..11].join(" "),
                "bwrap",
                measure_pair(n, hako_run, bwrap_true)?,
            )
        }
        BackendKind::Docker => {
            let image = default_image();
            let docker_run = || {
                status_ok(
                    std::process::Command::new("docker")
                        .args(["run", "--rm", "--network", "none"])
                        .args(&runtime_args)
                        .args([&image, "true"]),
                )
            };
            (
                format!(
                    "docker run --rm --network none {}{image} true",
                    runtime
                        .map(|r| format!("--runtime {r} "))
                        .unwrap_or_default()
                ),
                "docker_run",
                measure_pair(n, hako_run, docker_run)?,
            )
        }
        BackendKind::Gvisor => {
            let runsc = hako_container::gvisor::runsc_path(None);
            let root = workspace.join(".runsc-bench");
            let runsc_do = || {
                status_ok(
                    std::process::Command::new(&runsc)
                        .arg("--root")
                        .arg(&root)
                        .args(["--network=none", "do", "true"]),
                )
            };
            (
                format!("{} --network=none do true", runsc.display()),
                "runsc_do",
                measure_pair(n, hako_run, runsc_do)?,
            )
        }
        _ => (
            "fork/exec true".to_string(),
            "fork_exec",
            measure_pair(n, hako_run, fork_exec)?,
        ),
    };
    out.push(compare(
        format!("cold_run.ratio_vs_{reference_key}"),
        format!(
            "hako run --backend {} -- true (cold, whole process)",
            match runtime {
                Some(r) => format!("docker --runtime {r}"),
                None => label.to_string(),
            }
        ),
        Some(label),
        cold,
        &reference_name,
        reference,
    ));
    let mut spec = SandboxSpec::new(workspace.to_path_buf());
    spec.runtime = runtime.map(str::to_string);
    let sandbox = hako_runtime::open(kind, &spec).map_err(|e| e.to_string())?;
    let command = Command::new(["true"]);
    let (warm, fork) = measure_pair(n, || exec_true(sandbox.as_ref(), &command), fork_exec)?;
    out.push(compare(
        "warm_exec.ratio_vs_fork_exec".into(),
        format!("exec true in an open {} sandbox (library)", label),
        Some(label),
        warm,
        "fork/exec true",
        fork,
    ));
    // What a harness that runs each call through `docker exec` into a
    // running container pays, where Docker works: a runc container, and,
    // for gVisor's backends, one of the same isolation (Docker's runsc
    // runtime) where the daemon has it.
    let mut references = vec![runtime];
    if kind == BackendKind::Gvisor {
        references.push(Some("runsc"));
    }
    for runtime in references {
        let Ok(container) = ReferenceContainer::start(runtime) else {
            continue;
        };
        let (warm, docker_exec) = measure_pair(
            n,
            || exec_true(sandbox.as_ref(), &command),
            || container.exec_true(),
        )?;
        out.push(compare(
            format!(
                "warm_exec.ratio_vs_docker_exec_{}",
                runtime.unwrap_or("runc")
            ),
            format!("exec true in an open {} sandbox (library)", label),
            Some(label),
            warm,
            &format!(
                "docker exec (a running {} container)",
                runtime.unwrap_or("runc")
            ),
            docker_exec,
        ));
    }
    if kind == BackendKind::Docker && runtime.is_none() {
        // The fallback for images where the guest cannot run: a `docker
        // exec` per command.
        let mut spec = SandboxSpec::new(workspace.to_path_buf());
        spec.no_guest = true;
        let exec_mode = hako_runtime::open(kind, &spec).map_err(|e| e.to_string())?;
        let (warm, fallback) = measure_pair(
            n,
            || exec_true(sandbox.as_ref(), &command),
            || exec_true(exec_mode.as_ref(), &command),
        )?;
        exec_mode.close().map_err(|e| e.to_string())?;
        out.push(compare(
            "warm_exec.ratio_vs_docker_exec_mode".into(),
            "exec true in an open docker sandbox (library)".into(),
            Some(label),
            warm,
            "the same in docker exec mode (--no-guest)",
            fallback,
        ));
    }
    if kind == BackendKind::Linux {
        // What a harness that wraps each call in bubblewrap pays per call.
        out.push(compare(
            "warm_exec.ratio_vs_bwrap_per_call".into(),
            format!("exec true in an open {} sandbox (library)", label),
            Some(label),
            warm,
            &format!("{reference_name} (a new sandbox per call)"),
            reference,
        ));
    }
    if runtime.is_none() {
        bench_fence(sandbox.as_ref(), kind, workspace, n, out)?;
    }
    sandbox.close().map_err(|e| e.to_string())
}

fn bench_fence(
    sandbox: &dyn Sandbox,
    kind: BackendKind,
    workspace: &Path,
    n: usize,
    out: &mut Vec<Comparison>,
) -> Result<(), String> {
    for (label, key, size, reps) in [
        ("4 KiB", "4k", 4usize << 10, n * 20),
        ("1 MiB", "1m", 1 << 20, n * 2),
    ] {
        let data = vec![0x5au8; size];
        let name = format!("bench-{size}.bin");
        let rel = Path::new(&name);
        let abs = workspace.join(&name);
        let std_write = measure(reps, || {
            std::fs::write(&abs, &data).map_err(|e| e.to_string())
        })?;
        let hako_write = measure(reps, || {
            sandbox.write_file(rel, &data).map_err(|e| e.to_string())
        })?;
        out.push(compare(
            format!("fence_write_{key}.ratio_vs_std_fs_write"),
            format!(
                "{} fence write {label} (atomic: temp file + rename)",
                kind.name()
            ),
            Some(kind.name()),
            hako_write,
            "std::fs::write",
            std_write,
        ));
        let std_read = measure(reps, || {
            std::fs::read(&abs).map(|_| ()).map_err(|e| e.to_string())
        })?;
        let hako_read = measure(reps, || {
            sandbox
                .read_file(rel)
                .map(|_| ())
                .map_err(|e| e.to_string())
        })?;
        out.push(compare(
            format!("fence_read_{key}.ratio_vs_std_fs_read"),
            format!("{} fence read {label}", kind.name()),
            Some(kind.name()),
            hako_read,
            "std::fs::read",
            std_read,
        ));
    }
    Ok(())
}

/// How this executable was linked: `dynamic` when it names a program
/// interpreter (the dynamic loader), `static` when it does not.
fn linkage() -> &'static str {
    let exe = std::env::current_exe().ok();
    match exe.as_deref().and_then(hako_container::is_static_elf) {
        Some(true) => "static",
        Some(false) => "dynamic",
        None => "unknown",
    }
}

/// Bytes each transfer of the proxy benchmark moves.
const TRANSFER_BYTES: u64 = 100 << 20;

/// Serves [`TRANSFER_BYTES`] to each connection `listener` accepts, on a
/// thread of its own, until the process ends; with `unpaced`, each from a
/// socket that uses Reno, which does not pace, whatever the machine's
/// default congestion control. Returns the count of transfers written to
/// the end (each counted before its connection closes).
fn serve_transfers(
    listener: std::net::TcpListener,
    unpaced: bool,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = std::sync::Arc::clone(&served);
    std::thread::spawn(move || {
        let chunk = vec![0x5au8; 1 << 20];
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            if unpaced {
                let _ = hako_sys::rustix::net::sockopt::set_tcp_congestion(&conn, "reno");
            }
            let chunk = chunk.clone();
            let count = std::sync::Arc::clone(&count);
            std::thread::spawn(move || {
                use std::io::Write;
                for _ in 0..TRANSFER_BYTES / chunk.len() as u64 {
                    if conn.write_all(&chunk).is_err() {
                        return;
                    }
                }
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            });
        }
    });
    served
}

/// How long the transfer in a script's output took: the script prints two
/// `$EPOCHREALTIME` readings, taken around it.
fn transfer_time(stdout: &[u8]) -> Result<Duration, String> {
    let text = String::from_utf8_lossy(stdout).replace(',', ".");
    let t: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    match t[..] {
        [start, end] if end >= start => Ok(Duration::from_secs_f64(end - start)),
        _ => Err(format!("the transfer script printed {text:?}")),
    }
}

/// 100 MiB from a host service to a client inside a `linux` sandbox whose
/// allowlist forwards the service's port, against the same client reading
/// it straight over the host's loopback (the same `bash` and `cat` both
/// times, measured alternately): from `127.0.0.1:PORT` (the forwarder
/// hands the connection to the proxy, which relays it), through a
/// `CONNECT localhost:PORT` tunnel, and from a service whose socket does
/// not pace (so that neither path is held back by the machine's default
/// congestion control, and what is left is the relay's own cost). Each
/// script times its own transfer, from `connect` to the end of the
/// stream, so that starting a command in the sandbox (measured as warm
/// exec) is not counted in it.
fn bench_proxy_transfer(n: usize, workspace: &Path) -> Result<Vec<Throughput>, String> {
    let bash = find_in_path("bash").ok_or("bash is not installed")?;
    let listen = || {
        let l = std::net::TcpListener::bind(("127.0.0.1", 0)).map_err(|e| format!("bind: {e}"))?;
        let port = l.local_addr().map_err(|e| e.to_string())?.port();
        Ok::<_, String>((l, port))
    };
    let ((paced, port), (unpaced, unpaced_port)) = (listen()?, listen()?);
    let timed =
        |transfer: &str| format!("s=$EPOCHREALTIME\n{transfer}\necho \"$s $EPOCHREALTIME\"");
    let direct = |port: u16| timed(&format!("cat </dev/tcp/127.0.0.1/{port} >/dev/null"));
    // The proxy's port from HTTP_PROXY; the reply's head read line by line.
    let tunnel = timed(&format!(
        r#"exec 3<>/dev/tcp/127.0.0.1/${{HTTP_PROXY##*:}}
printf 'CONNECT localhost:{port} HTTP/1.1\r\nHost: localhost:{port}\r\n\r\n' >&3
IFS= read -r status <&3
case $status in *" 200 "*) ;; *) echo "$status" >&2; exit 1;; esac
while IFS= read -r line <&3 && [ "$line" != $'\r' ]; do :; done
cat <&3 >/dev/null"#
    ));
    let mut spec = SandboxSpec::new(workspace.to_path_buf());
    spec.network = Some(hako_core::NetworkPolicy::allow([
        format!("localhost:{port}"),
        format!("localhost:{unpaced_port}"),
    ]));
    // Opened while this process has one thread, so that the guest runs in
    // a fork of it (no hako-guest binary needed); the servers start after.
    let sandbox = hako_runtime::open(BackendKind::Linux, &spec).map_err(|e| e.to_string())?;
    let served = [
        serve_transfers(paced, false),
        serve_transfers(unpaced, true),
    ];
    // Runs one transfer and returns the time its script printed. A
    // transfer cut short (a refused connection reads as an empty stream)
    // must fail the run, not count as a fast one.
    let whole = |which: usize, run: &dyn Fn() -> Result<Vec<u8>, String>| {
        let count = || served[which].load(std::sync::atomic::Ordering::SeqCst);
        let before = count();
        let time = transfer_time(&run()?)?;
        if count() > before {
            Ok(time)
        } else {
            Err("a transfer ended before the service had sent all of it".to_string())
        }
    };
    let mib_s = |s: Stats| (TRANSFER_BYTES as f64 / (1 << 20) as f64) / (s.median_us / 1e6);
    let mut measured = Vec::new();
    for (figure, name, inside, reference, which) in [
        (
            "proxy_throughput.ratio_vs_loopback",
            "linux 100 MiB from a forwarded host port, through the egress proxy",
            direct(port),
            direct(port),
            0,
        ),
        (
            "proxy_connect_throughput.ratio_vs_loopback",
            "linux 100 MiB through a CONNECT tunnel of the egress proxy",
            tunnel.clone(),
            direct(port),
            0,
        ),
        (
            "proxy_unpaced_throughput.ratio_vs_loopback",
            "linux 100 MiB from a forwarded port whose service does not pace",
            direct(unpaced_port),
            direct(unpaced_port),
            1,
        ),
    ] {
        let command = Command::new([bash.display().to_string(), "-c".into(), inside]);
        let in_sandbox = || {
            whole(which, &|| {
                let out = sandbox.exec(&command).map_err(|e| e.to_string())?;
                if !out.status.success() {
                    return Err(format!(
                        "the transfer inside failed: {:?}: {}",
                        out.status,
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                Ok(out.stdout)
            })
        };
        let on_host = || {
            whole(which, &|| {
                let out = std::process::Command::new(&bash)
                    .args(["-c", &reference])
                    .stdin(Stdio::null())
                    .output()
                    .map_err(|e| format!("bash: {e}"))?;
                if !out.status.success() {
                    return Err(format!("the loopback transfer failed: {}", out.status));
                }
                Ok(out.stdout)
            })
        };
        let (through, direct) = alternate(n.clamp(3, 50), in_sandbox, on_host)?;
        measured.push(Throughput {
            figure: figure.into(),
            name: name.into(),
            backend: "linux",
            bytes: TRANSFER_BYTES,
            hako_mib_s: mib_s(through),
            reference: "direct loopback".into(),
            reference_mib_s: mib_s(direct),
            ratio: direct.median_us / through.median_us.max(f64::MIN_POSITIVE),
        });
    }
    let _ = sandbox.close();
    Ok(measured)
}

/// Runs `hako bench`.
pub fn run(args: BenchArgs) -> u8 {
    let n = args.iterations;
    let requested = if args.backend.is_empty() {
        vec![BackendArg::Host]
    } else {
        args.backend.iter().map(|flag| flag.0).collect()
    };
    let workspace = std::env::temp_dir().join(format!("hako-bench-{}", std::process::id()));
    let mut report = Report {
        iterations: n,
        linked: linkage(),
        figures: Default::default(),
        comparisons: Vec::new(),
        throughput: Vec::new(),
        references: Vec::new(),
        errors: Vec::new(),
    };
    if let Err(e) = std::fs::create_dir_all(&workspace) {
        eprintln!("hako: cannot create {}: {e}", workspace.display());
        return crate::exit::SANDBOX_FAILED;
    }
    for arg in requested {
        let result = hako_runtime::resolve(arg)
            .map_err(|e| e.to_string())
            .and_then(|kind| {
                bench_backend(kind, None, n, &workspace, &mut report.comparisons)?;
                if kind == BackendKind::Linux {
                    report
                        .throughput
                        .extend(bench_proxy_transfer(n, &workspace)?);
                }
                // docker on gVisor too, where the daemon has it.
                if kind == BackendKind::Docker
                    && hako_container::docker::ready(&default_image(), Some("runsc")).is_ok()
                {
                    bench_backend(kind, Some("runsc"), n, &workspace, &mut report.comparisons)?;
                }
                Ok(())
            });
        if let Err(e) = result {
            report.errors.push(format!("{arg:?}: {e}"));
        }
    }
    report.references = references(n);
    for c in &report.comparisons {
        if let Some(backend) = c.backend {
            report
                .figures
                .entry(backend.to_string())
                .or_default()
                .insert(c.figure.clone(), c.ratio);
        }
    }
    for t in &report.throughput {
        report
            .figures
            .entry(t.backend.to_string())
            .or_default()
            .insert(t.figure.clone(), t.ratio);
    }
    let _ = std::fs::remove_dir_all(&workspace);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).unwrap_or_default()
        );
    } else {
        println!("{n} runs each; median (p90); ratio = hako / reference, lower is better");
        if report.linked == "dynamic" {
            println!("note: this hako is dynamically linked, and its cold starts pay for the dynamic loader; ./scripts/build links it static-pie");
        }
        for c in &report.comparisons {
            println!(
                "{:<62} {:>9.1} us ({:>9.1})  vs {:<16} {:>9.1} us  ratio {:>6.2}",
                c.name,
                c.hako.median_us,
                c.hako.p90_us,
                c.reference,
                c.reference_stats.median_us,
                c.ratio
            );
        }
        for t in &report.throughput {
            println!(
                "{:<62} {:>9.0} MiB/s  vs {:<16} {:>9.0} MiB/s  ratio {:>6.2} (higher is better)",
                t.name, t.hako_mib_s, t.reference, t.reference_mib_s, t.ratio
            );
        }
        for r in &report.references {
            match (&r.stats, &r.skipped) {
                (Some(s), _) => println!("reference {:<52} {:>9.1} us", r.tool, s.median_us),
                (None, Some(why)) => println!("reference {:<52} skipped: {why}", r.tool),
                _ => {}
            }
        }
        for e in &report.errors {
            println!("error: {e}");
        }
    }
    u8::from(!report.errors.is_empty())
}
