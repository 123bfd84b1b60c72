//! `hako bench`: the flags, and a call into `hako_bench`, which measures
//! each backend against the reference tool in the same run.

use clap::Args;

use super::BackendFlag;

/// Flags of `hako bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend to measure (repeatable) [default: host].
    #[arg(long, value_enum)]
    backend: Vec<BackendFlag>,
    /// Runs per measurement [default: 50; 10 with --cow].
    #[arg(long)]
    iterations: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Also measure, on each backend, one `commands.run("true")` through
    /// E2B's `e2b` SDK (hako serve --e2b) against the same call through
    /// hako's own Python SDK (hako serve), with this Python (it must have
    /// both packages).
    #[arg(long, value_name = "PYTHON", conflicts_with_all = ["load", "cow"])]
    sdk_python: Option<std::path::PathBuf>,
    /// Instead: the load benchmark (many sandboxes through `hako serve`,
    /// against `docker run -d` + `docker exec`).
    #[arg(long)]
    load: bool,
    /// With --load: sandboxes opened at once.
    #[arg(long, default_value_t = 1000, requires = "load")]
    sandboxes: usize,
    /// With --load: concurrent clients.
    #[arg(long, default_value_t = 10, requires = "load")]
    clients: usize,
    /// With --load: commands run in each sandbox.
    #[arg(long, default_value_t = 10, requires = "load")]
    commands: usize,
    /// With --load: at most this many Docker containers (0: none).
    #[arg(long, default_value_t = 100, requires = "load")]
    docker_containers: usize,
    /// Instead: the copy-on-write figures on linux (a write-heavy job
    /// under --cow against a plain sandbox; `hako diff` of 100 changes
    /// against `git status` of the same tree).
    #[arg(long, conflicts_with_all = ["load", "backend"])]
    cow: bool,
    /// With --cow: files the write job unpacks (and rewrites a tenth of).
    #[arg(long, default_value_t = 20_000, requires = "cow")]
    cow_files: usize,
    /// With --cow: files in the workspace `hako diff` is timed on.
    #[arg(long, default_value_t = 100_000, requires = "cow")]
    diff_files: usize,
}

/// Runs `hako bench`: 0 when every backend was measured, 1 when one could
/// not be, [`SANDBOX_FAILED`](crate::exit::SANDBOX_FAILED) when the
/// benchmark could not start.
pub fn run(args: BenchArgs) -> u8 {
    if args.load {
        return load(&args);
    }
    let report = if args.cow {
        hako_bench::run_cow(&hako_bench::CowOptions {
            files: args.cow_files,
            diff_files: args.diff_files,
            iterations: args.iterations.unwrap_or(10),
            hako: None,
        })
    } else {
        hako_bench::run(&hako_bench::Options {
            backends: args.backend.iter().map(|flag| flag.0).collect(),
            iterations: args.iterations.unwrap_or(50),
            hako: None,
            sdk_python: args.sdk_python.clone(),
        })
    };
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("hako: {e}");
            return crate::exit::SANDBOX_FAILED;
        }
    };
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.table());
    }
    u8::from(!report.errors.is_empty())
}

/// `hako bench --load`: 0 when every open, command and close succeeded, 1
/// when one failed, [`SANDBOX_FAILED`](crate::exit::SANDBOX_FAILED) when
/// the benchmark could not start.
fn load(args: &BenchArgs) -> u8 {
    let backend = match args.backend.as_slice() {
        [] => "linux".to_string(),
        [one] => one.0.name().to_string(),
        _ => {
            eprintln!("hako: --load takes one --backend");
            return crate::exit::SANDBOX_FAILED;
        }
    };
    let options = hako_bench::LoadOptions {
        backend,
        sandboxes: args.sandboxes,
        clients: args.clients,
        commands: args.commands,
        docker_containers: args.docker_containers,
        hako: None,
    };
    match hako_bench::run_load(&options) {
        Ok(report) => {
            if args.json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.table());
            }
            let errors = report.hako.errors + report.docker.as_ref().map_or(0, |d| d.errors);
            u8::from(errors > 0)
        }
        Err(e) => {
            eprintln!("hako: {e}");
            crate::exit::SANDBOX_FAILED
        }
    }
}
