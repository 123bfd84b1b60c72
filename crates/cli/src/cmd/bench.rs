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
}

/// Runs `hako bench`: 0 when every backend was measured, 1 when one could
/// not be, [`SANDBOX_FAILED`](crate::exit::SANDBOX_FAILED) when the
/// benchmark could not start.
pub fn run(args: BenchArgs) -> u8 {
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
