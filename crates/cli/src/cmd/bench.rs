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
    /// Runs per measurement.
    #[arg(long, default_value_t = 50)]
    iterations: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
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
}

/// Runs `hako bench`: 0 when every backend was measured, 1 when one could
/// not be, [`SANDBOX_FAILED`](crate::exit::SANDBOX_FAILED) when the
/// benchmark could not start.
pub fn run(args: BenchArgs) -> u8 {
    if args.load {
        return load(&args);
    }
    let options = hako_bench::Options {
        backends: args.backend.iter().map(|flag| flag.0).collect(),
        iterations: args.iterations,
        hako: None,
    };
    let report = match hako_bench::run(&options) {
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
