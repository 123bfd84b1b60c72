//! The load benchmark (`hako bench --load`): many sandboxes opened at once
//! through the HTTP API of a `hako serve` it starts on loopback, commands
//! run in each from concurrent clients, and the same work done with
//! `docker run -d` and `docker exec`.
//!
//! Reported for each side: the time to open all, each command's latency
//! (p50, p99), every error (the first few verbatim), and the host memory
//! an idle sandbox costs: the proportional set size (`Pss` of
//! `/proc/PID/smaps_rollup`) of the server and every process below it
//! (the guests) once all are open and idle, less the server's own before
//! the first was opened, divided by how many are open. For Docker, the
//! `containerd-shim` of each container and everything below it (the
//! daemons' own growth is not counted, which flatters Docker).

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::http::Client;

/// What to load.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The backend `hako serve` opens its sandboxes with (`linux`).
    pub backend: String,
    /// Sandboxes opened at once (1,000).
    pub sandboxes: usize,
    /// Concurrent clients (10).
    pub clients: usize,
    /// Commands run in each sandbox (10).
    pub commands: usize,
    /// At most this many containers on Docker's side; 0 leaves it out.
    pub docker_containers: usize,
    /// The `hako` executable that serves; `None`: this process's own.
    pub hako: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            backend: "linux".into(),
            sandboxes: 1000,
            clients: 10,
            commands: 10,
            docker_containers: 100,
            hako: None,
        }
    }
}

/// One side's figures.
#[derive(Debug, Clone, Serialize)]
pub struct LoadSide {
    /// `hako serve --backend B` or `docker run -d + docker exec`.
    pub tool: String,
    /// Sandboxes (or containers) asked for.
    pub asked: usize,
    /// Sandboxes (or containers) that opened.
    pub opened: usize,
    /// Seconds until every one asked for was open (or refused).
    pub open_secs: f64,
    /// Commands run, and how many of them succeeded.
    pub commands: usize,
    /// Median latency of one command, milliseconds.
    pub exec_p50_ms: f64,
    /// 99th percentile latency of one command, milliseconds.
    pub exec_p99_ms: f64,
    /// p99 / p50.
    pub exec_p99_over_p50: f64,
    /// Seconds the commands took, all clients together.
    pub exec_secs: f64,
    /// Every failed open, command or close.
    pub errors: usize,
    /// The first few errors, verbatim.
    pub first_errors: Vec<String>,
    /// Host memory per idle sandbox, MiB: PSS of the server and every
    /// process below it, less the server's before any sandbox, over the
    /// number open (for Docker: the shims and the containers' processes).
    pub pss_per_idle_mib: Option<f64>,
    /// The whole PSS so measured, MiB.
    pub pss_total_mib: Option<f64>,
}

/// Both sides.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// hako's side.
    pub hako: LoadSide,
    /// Docker's side, if it was measured.
    pub docker: Option<LoadSide>,
    /// Why Docker's side was not measured.
    pub docker_skipped: Option<String>,
    /// Concurrent clients.
    pub clients: usize,
    /// Commands per sandbox.
    pub commands_per_sandbox: usize,
}

impl LoadReport {
    /// As pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// As a table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "load: {} clients, {} commands (`echo ok`) per sandbox\n\
             {:<36} {:>7} {:>9} {:>9} {:>9} {:>8} {:>7} {:>12}\n",
            self.clients,
            self.commands_per_sandbox,
            "tool",
            "opened",
            "open s",
            "p50 ms",
            "p99 ms",
            "p99/p50",
            "errors",
            "MiB/idle sb"
        );
        for side in std::iter::once(&self.hako).chain(self.docker.as_ref()) {
            out.push_str(&format!(
                "{:<36} {:>7} {:>9.2} {:>9.2} {:>9.2} {:>8.1} {:>7} {:>12}\n",
                side.tool,
                format!("{}/{}", side.opened, side.asked),
                side.open_secs,
                side.exec_p50_ms,
                side.exec_p99_ms,
                side.exec_p99_over_p50,
                side.errors,
                side.pss_per_idle_mib
                    .map_or_else(|| "-".into(), |m| format!("{m:.2}")),
            ));
            for e in &side.first_errors {
                out.push_str(&format!("  error: {e}\n"));
            }
        }
        if let Some(why) = &self.docker_skipped {
            out.push_str(&format!("docker: not measured: {why}\n"));
        }
        out
    }
}

/// How many errors are kept verbatim.
const FIRST_ERRORS: usize = 5;

/// Errors counted, the first few kept.
#[derive(Default)]
struct Errors {
    count: AtomicUsize,
    first: Mutex<Vec<String>>,
}

impl Errors {
    fn push(&self, e: String) {
        self.count.fetch_add(1, Ordering::SeqCst);
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.len() < FIRST_ERRORS {
            first.push(e);
        }
    }
}

/// Runs `work(i)` for i in 0..n on `clients` threads, each taking the next
/// index; the results in index order.
fn fan_out<T: Send>(n: usize, clients: usize, work: impl Fn(usize, usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<T>>> = Mutex::new((0..n).map(|_| None).collect());
    let client_loop = |client: usize| loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        if i >= n {
            break;
        }
        let r = work(client, i);
        results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
    };
    std::thread::scope(|scope| {
        // A machine out of processes (the sandboxes hold most of them)
        // gives fewer clients, not a panic; client 0 is this thread.
        for client in 1..clients.max(1) {
            let client_loop = &client_loop;
            let spawned =
                std::thread::Builder::new().spawn_scoped(scope, move || client_loop(client));
            if spawned.is_err() {
                break;
            }
        }
        client_loop(0);
    });
    results
        .into_inner()
        .unwrap_or_else(|p| p.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// The `q` quantile (0..=1) of sorted `samples`, nearest rank.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Fills a side's latency figures from `samples`.
fn latencies(side: &mut LoadSide, mut samples: Vec<Duration>) {
    samples.sort();
    side.exec_p50_ms = ms(quantile(&samples, 0.5));
    side.exec_p99_ms = ms(quantile(&samples, 0.99));
    side.exec_p99_over_p50 = if side.exec_p50_ms > 0.0 {
        side.exec_p99_ms / side.exec_p50_ms
    } else {
        0.0
    };
}

/// The Pss of `/proc/PID/smaps_rollup` in KiB (0 for a process gone).
fn pss_kib(pid: u32) -> u64 {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
        return 0;
    };
    parse_pss(&text)
}

/// The `Pss:` line of a smaps_rollup, KiB.
fn parse_pss(text: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Every process's parent, from `/proc/PID/stat`.
fn parents() -> Vec<(u32, u32)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command may hold spaces and parentheses: the fields after
            // its last ')' are "state ppid ...".
            let rest = &stat[stat.rfind(')')? + 1..];
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// `roots` and every process below them.
fn tree(roots: &[u32]) -> Vec<u32> {
    let all = parents();
    let mut found: Vec<u32> = roots.to_vec();
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(all.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
}

fn total_pss_kib(roots: &[u32]) -> u64 {
    tree(roots).into_iter().map(pss_kib).sum()
}

/// A free loopback port (bound, read, let go).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

/// The server this benchmark started; stopped (SIGTERM, then SIGKILL) when
/// dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM: the server closes every sandbox it still has.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the load benchmark.
pub fn run_load(options: &LoadOptions) -> Result<LoadReport, String> {
    let scratch = std::env::temp_dir().join(format!("hako-bench-load-{}", std::process::id()));
    std::fs::create_dir_all(scratch.join("ws"))
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let hako_side = load_hako(options, &scratch);
    let _ = std::fs::remove_dir_all(&scratch);
    let hako = hako_side?;
    let (docker, docker_skipped) = if options.docker_containers == 0 {
        (
            None,
            Some("not asked for (--docker-containers 0)".to_string()),
        )
    } else {
        match load_docker(options) {
            Ok(side) => (Some(side), None),
            Err(e) => (None, Some(e)),
        }
    };
    Ok(LoadReport {
        hako,
        docker,
        docker_skipped,
        clients: options.clients,
        commands_per_sandbox: options.commands,
    })
}

fn new_side(tool: String, asked: usize) -> LoadSide {
    LoadSide {
        tool,
        asked,
        opened: 0,
        open_secs: 0.0,
        commands: 0,
        exec_p50_ms: 0.0,
        exec_p99_ms: 0.0,
        exec_p99_over_p50: 0.0,
        exec_secs: 0.0,
        errors: 0,
        first_errors: Vec::new(),
        pss_per_idle_mib: None,
        pss_total_mib: None,
    }
}

fn load_hako(options: &LoadOptions, scratch: &Path) -> Result<LoadSide, String> {
    let hako = match &options.hako {
        Some(p) => p.clone(),
        None => std::env::current_exe().map_err(|e| format!("cannot find hako: {e}"))?,
    };
    let token = format!("load-{}-{}", std::process::id(), fastish_nonce());
    let token_file = scratch.join("token");
    write_private(&token_file, &token)?;
    let port = free_port()?;
    let n = options.sandboxes;
    let child = std::process::Command::new(&hako)
        .args(["serve", "--backend", &options.backend, "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--workspace")
        .arg(scratch.join("ws"))
        .arg("--token-file")
        .arg(&token_file)
        .args(["--max-sandboxes", &n.max(1).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {} serve: {e}", hako.display()))?;
    let server = Server(child);
    let server_pid = server.0.id();
    let mut side = new_side(format!("hako serve --backend {}", options.backend), n);
    // Ready when it answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::new(port, &token).call("GET", "/v1/health", "") {
            Ok(a) if a.status == 200 => break,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Ok(a) => return Err(format!("hako serve's health answered {}", a.status)),
            Err(e) => return Err(format!("hako serve never answered: {e}")),
        }
    }
    let baseline = total_pss_kib(&[server_pid]);
    let errors = Errors::default();
    let clients: Vec<Mutex<Client>> = (0..options.clients.max(1))
        .map(|_| Mutex::new(Client::new(port, &token)))
        .collect();
    let call = |client: usize, method: &str, path: &str, body: &str| {
        let mut c = clients[client].lock().unwrap_or_else(|p| p.into_inner());
        c.call(method, path, body)
    };

    // Open all.
    let started = Instant::now();
    let ids: Vec<Option<u64>> = fan_out(n, options.clients, |client, _| {
        match call(client, "POST", "/v1/sandboxes", "") {
            Ok(a) if a.status == 201 => serde_json::from_slice::<serde_json::Value>(&a.body)
                .ok()
                .and_then(|v| v["id"].as_u64()),
            Ok(a) => {
                errors.push(format!(
                    "open: {} {}",
                    a.status,
                    String::from_utf8_lossy(&a.body).trim()
                ));
                None
            }
            Err(e) => {
                errors.push(format!("open: {e}"));
                None
            }
        }
    });
    side.open_secs = started.elapsed().as_secs_f64();
    let ids: Vec<u64> = ids.into_iter().flatten().collect();
    side.opened = ids.len();

    // Commands: each client takes the next sandbox and runs all of its
    // commands.
    let body = r#"{"argv":["echo","ok"],"timeout_ms":60000}"#;
    let started = Instant::now();
    let samples: Vec<Vec<Duration>> = fan_out(ids.len(), options.clients, |client, i| {
        let path = format!("/v1/sandboxes/{}/exec", ids[i]);
        (0..options.commands)
            .filter_map(|_| {
                let t = Instant::now();
                let r = call(client, "POST", &path, body);
                let took = t.elapsed();
                match r {
                    Ok(a) if a.status == 200 && exec_ok(&a.body) => Some(took),
                    Ok(a) => {
                        errors.push(format!(
                            "exec: {} {}",
                            a.status,
                            String::from_utf8_lossy(&a.body).trim()
                        ));
                        None
                    }
                    Err(e) => {
                        errors.push(format!("exec: {e}"));
                        None
                    }
                }
            })
            .collect()
    });
    side.exec_secs = started.elapsed().as_secs_f64();
    let samples: Vec<Duration> = samples.into_iter().flatten().collect();
    side.commands = samples.len();
    latencies(&mut side, samples);

    // Idle: let the last replies settle, then measure.
    std::thread::sleep(Duration::from_millis(500));
    let total = total_pss_kib(&[server_pid]);
    side.pss_total_mib = Some(total as f64 / 1024.0);
    if !ids.is_empty() {
        side.pss_per_idle_mib =
            Some(total.saturating_sub(baseline) as f64 / 1024.0 / ids.len() as f64);
    }

    // Close all.
    fan_out(ids.len(), options.clients, |client, i| {
        match call(client, "DELETE", &format!("/v1/sandboxes/{}", ids[i]), "") {
            Ok(a) if a.status == 200 => {}
            Ok(a) => errors.push(format!(
                "close: {} {}",
                a.status,
                String::from_utf8_lossy(&a.body).trim()
            )),
            Err(e) => errors.push(format!("close: {e}")),
        }
    });
    drop(server);
    side.errors = errors.count.load(Ordering::SeqCst);
    side.first_errors = errors.first.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(side)
}

/// Whether an exec's answer is `echo ok`'s: exit 0, `ok` on stdout.
fn exec_ok(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|v| v["exit_code"] == 0 && v["stdout"] == "ok\n")
}

/// Writes `text` to a new file only its owner may read.
fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Something that differs from run to run, for the throwaway token (the
/// server listens on loopback for the benchmark's lifetime only).
fn fastish_nonce() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Docker's side: `docker run -d IMAGE sleep infinity` for as many
/// containers as asked (at most [`LoadOptions::docker_containers`]), then
/// the same commands through `docker exec`, then `docker rm -f`.
fn load_docker(options: &LoadOptions) -> Result<LoadSide, String> {
    let image = crate::reference::default_image();
    // The image hako's docker backend runs (busybox and the guest): any
    // image with `sleep` and `echo` would do; this one is already here
    // wherever `hako bench --backend docker` runs.
    let present = std::process::Command::new("docker")
        .args(["image", "inspect", &image])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run docker: {e}"))?;
    if !present.success() {
        return Err(format!(
            "no image {image} (or no Docker daemon); hint: hako image build"
        ));
    }
    let n = options.docker_containers.min(options.sandboxes.max(1));
    let label = format!("hako-bench-load={}", std::process::id());
    let mut side = new_side("docker run -d + docker exec".into(), n);
    let errors = Errors::default();
    let docker = |args: &[&str]| -> Result<String, String> {
        let out = std::process::Command::new("docker")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("docker: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(format!(
                "docker {}: {}",
                args.first().copied().unwrap_or(""),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    let started = Instant::now();
    let ids: Vec<Option<String>> = fan_out(n, options.clients, |_, _| {
        match docker(&[
            "run",
            "-d",
            "--rm",
            "--label",
            &label,
            "--network",
            "none",
            &image,
            "sleep",
            "infinity",
        ]) {
            Ok(id) => Some(id),
            Err(e) => {
                errors.push(format!("run: {e}"));
                None
            }
        }
    });
    side.open_secs = started.elapsed().as_secs_f64();
    let ids: Vec<String> = ids.into_iter().flatten().collect();
    side.opened = ids.len();
    let started = Instant::now();
    let samples: Vec<Vec<Duration>> = fan_out(ids.len(), options.clients, |_, i| {
        (0..options.commands)
            .filter_map(|_| {
                let t = Instant::now();
                match docker(&["exec", &ids[i], "echo", "ok"]) {
                    Ok(out) if out == "ok" => Some(t.elapsed()),
                    Ok(out) => {
                        errors.push(format!("exec: printed {out:?}"));
                        None
                    }
                    Err(e) => {
                        errors.push(format!("exec: {e}"));
                        None
                    }
                }
            })
            .collect()
    });
    side.exec_secs = started.elapsed().as_secs_f64();
    let samples: Vec<Duration> = samples.into_iter().flatten().collect();
    side.commands = samples.len();
    latencies(&mut side, samples);
    std::thread::sleep(Duration::from_millis(500));
    // Each container's shim (its init's parent) and everything below it.
    let shims: Vec<u32> = ids
        .iter()
        .filter_map(|id| docker(&["inspect", "-f", "{{.State.Pid}}", id]).ok())
        .filter_map(|pid| pid.parse::<u32>().ok())
        .filter_map(|pid| {
            let all = parents();
            all.iter().find(|(p, _)| *p == pid).map(|(_, pp)| *pp)
        })
        .collect();
    if !shims.is_empty() {
        let total = total_pss_kib(&shims);
        side.pss_total_mib = Some(total as f64 / 1024.0);
        side.pss_per_idle_mib = Some(total as f64 / 1024.0 / shims.len() as f64);
    }
    for chunk in ids.chunks(50) {
        let mut args = vec!["rm", "-f"];
        args.extend(chunk.iter().map(String::as_str));
        if let Err(e) = docker(&args) {
            errors.push(format!("rm: {e}"));
        }
    }
    side.errors = errors.count.load(Ordering::SeqCst);
    side.first_errors = errors.first.into_inner().unwrap_or_else(|p| p.into_inner());
    Ok(side)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank_and_an_empty_sample_is_zero() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&s, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&s, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&s, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&[], 0.99), Duration::ZERO);
    }

    #[test]
    fn pss_is_read_from_smaps_rollup_and_a_missing_line_is_zero() {
        let text = "00400000-7fff [rollup]\nRss:  2048 kB\nPss:  1234 kB\nPss_Anon: 1 kB\n";
        assert_eq!(parse_pss(text), 1234);
        assert_eq!(parse_pss("Rss: 1 kB\n"), 0);
        assert!(pss_kib(std::process::id()) > 0);
    }

    #[test]
    fn fan_out_runs_every_index_once_in_order_whatever_the_clients() {
        for clients in [1, 3, 10] {
            let got = fan_out(25, clients, |_, i| i * 2);
            assert_eq!(got, (0..25).map(|i| i * 2).collect::<Vec<_>>());
        }
    }

    #[test]
    fn this_process_is_in_its_own_tree() {
        let me = std::process::id();
        assert!(tree(&[me]).contains(&me));
    }
}
