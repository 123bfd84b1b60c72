//! Where hako's log events go.
//!
//! With `HAKO_LOG` set (a `tracing` filter such as `debug` or
//! `hako_net=trace`), `tracing-subscriber`'s formatter prints what it
//! selects. Without it, only warnings and errors are printed to stderr, one
//! line each, by [`Warnings`]: it keeps no state and costs nothing at
//! start-up, which a cold `hako run` would otherwise pay for on every call.

use std::fmt::Write as _;

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the logger for this process.
pub fn init() {
    match std::env::var_os("HAKO_LOG") {
        Some(_) => tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_env("HAKO_LOG")
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .init(),
        None => {
            // A warning may carry text from inside (a guest's message, a
            // path): escaped, it stays one inert line.
            let to_stderr = Warnings(|line: String| eprintln!("{}", crate::show::message(&line)));
            let _ = tracing::subscriber::set_global_default(to_stderr);
        }
    }
}

/// Hands each warning and error, as the line `hako: LEVEL target: message
/// field=value ...`, to its function; everything else is disabled.
pub struct Warnings<F>(F);

impl<F: Fn(String) + Send + Sync + 'static> Subscriber for Warnings<F> {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::WARN
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(LevelFilter::WARN)
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Spans are never enabled (see `enabled`), so never built; one id
        // serves should the question be asked.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        (self.0)(format_event(event));
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// One event as a line.
fn format_event(event: &Event<'_>) -> String {
    let metadata = event.metadata();
    let mut line = Line::default();
    event.record(&mut line);
    format!(
        "hako: {} {}: {}{}",
        metadata.level(),
        metadata.target(),
        line.message,
        line.fields
    )
}

/// The message of an event and its other fields.
#[derive(Default)]
struct Line {
    message: String,
    fields: String,
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.fields, " {}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.fields, " {}={value}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_and_errors_are_printed_with_their_fields_and_the_rest_is_not() {
        let captured = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = std::sync::Arc::clone(&captured);
        let capture = Warnings(move |line: String| {
            if let Ok(mut lines) = sink.lock() {
                lines.push(line);
            }
        });
        tracing::subscriber::with_default(capture, || {
            tracing::info!("not shown");
            tracing::debug!(x = 1, "not shown either");
            tracing::warn!(error = %"boom", count = 3, "relay stopped");
            tracing::error!("gone");
        });
        let lines = captured.lock().map(|l| l.clone()).unwrap_or_default();
        let here = module_path!();
        assert_eq!(
            lines,
            vec![
                format!("hako: WARN {here}: relay stopped error=boom count=3"),
                format!("hako: ERROR {here}: gone"),
            ]
        );
    }
}
