//! Timing: medians and 90th percentiles over many runs, and pairs of
//! measurements taken alternately.

use std::time::{Duration, Instant};

use serde::Serialize;

/// The statistics of one measurement, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// The median run.
    pub median_us: f64,
    /// The 90th percentile.
    pub p90_us: f64,
}

/// Times `n` runs of `f` (at least one), after one untimed run.
pub(crate) fn measure(
    n: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<Stats, String> {
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
pub(crate) fn measure_pair(
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
pub(crate) fn alternate(
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

/// The median and 90th percentile of `samples` (not empty).
pub(crate) fn stats(mut samples: Vec<Duration>) -> Stats {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    Stats {
        median_us: us(at(0.5)),
        p90_us: us(at(0.9)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn stats_are_the_median_and_the_90th_percentile_whatever_the_order() {
        let s = stats((1..=11).rev().map(ms).collect());
        assert_eq!(s.median_us, 6_000.0);
        assert_eq!(s.p90_us, 10_000.0);
        let one = stats(vec![ms(2)]);
        assert_eq!((one.median_us, one.p90_us), (2_000.0, 2_000.0));
    }

    #[test]
    fn alternate_runs_each_side_once_untimed_then_n_times_turn_about() {
        let order = std::cell::RefCell::new(Vec::new());
        let (a, b) = alternate(
            4,
            || {
                order.borrow_mut().push('a');
                Ok(ms(1))
            },
            || {
                order.borrow_mut().push('b');
                Ok(ms(3))
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(order.borrow().iter().collect::<String>(), "ababbaabba");
        assert_eq!((a.median_us, b.median_us), (1_000.0, 3_000.0));
    }

    #[test]
    fn a_failed_run_fails_the_measurement() {
        let mut runs = 0;
        let result = measure(5, || {
            runs += 1;
            if runs == 3 {
                Err("third".to_string())
            } else {
                Ok(())
            }
        });
        assert_eq!(result, Err("third".to_string()));
        assert!(measure(0, || Ok(())).is_ok(), "zero runs means one");
        let failed = measure_pair(3, || Ok(()), || Err("b".to_string()));
        assert_eq!(failed, Err("b".to_string()));
    }
}
