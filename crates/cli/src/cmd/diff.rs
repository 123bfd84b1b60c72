//! `hako diff NAME`: what a copy-on-write sandbox changed, as a unified
//! diff like `git diff` (or `--stat`, `--json`), and the hash `hako
//! commit --expect` takes to commit exactly that.
//!
//! On a terminal, the controls a file's content or name may carry (which
//! could erase or rewrite lines of the review) are shown escaped; piped,
//! the diff is printed as it is (for `git apply`). The hash is the last
//! line (`# hash: HEX`, which `git apply` skips), or the `hash` field of
//! the JSON, or the only output with `--hash`.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::Args;
use hako_layers::{commit::select, diff_hash, render, Layers};

use super::named::{review_failed, NamedArgs};
use crate::exit;

/// Flags of `hako diff`.
#[derive(Debug, Args)]
pub struct DiffArgs {
    #[command(flatten)]
    named: NamedArgs,
    /// Only these paths (and what is beneath them), relative to the workspace.
    #[arg(value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// A summary: one line per change and the totals.
    #[arg(long, conflicts_with_all = ["json", "hash"])]
    stat: bool,
    /// JSON: the hash and one entry per change.
    #[arg(long, conflicts_with = "hash")]
    json: bool,
    /// Only the hash.
    #[arg(long)]
    hash: bool,
    /// Compare from this checkpoint (number or label) instead of the workspace.
    #[arg(long, value_name = "CHECKPOINT")]
    from: Option<String>,
    /// Compare to this checkpoint instead of the sandbox as it is now.
    #[arg(long, value_name = "CHECKPOINT")]
    to: Option<String>,
}

/// The layers to compare: the workspace (or checkpoint `from`) to the
/// sandbox now (or checkpoint `to`).
fn open(args: &DiffArgs) -> Result<(hako_layers::state::State, Layers), u8> {
    if args.from.is_none() && args.to.is_none() {
        return args.named.layers(true);
    }
    let state = args.named.open(true)?;
    let workspace = state
        .workspace()
        .map_err(|e| super::named::state_failed(&e))?;
    let upper_of = |which: &Option<String>| -> Result<Option<PathBuf>, u8> {
        match which {
            None => Ok(None),
            Some(w) => state
                .checkpoint_upper(w)
                .map(|(_, upper)| Some(upper))
                .map_err(|e| super::checkpoint::failed(&e)),
        }
    };
    let from = upper_of(&args.from)?;
    let to = upper_of(&args.to)?.unwrap_or_else(|| state.upper());
    let opened = match &from {
        Some(from) => Layers::open_between(&workspace, from, &to),
        None => Layers::open(&workspace, &to),
    };
    match opened {
        Ok(layers) => Ok((state, layers)),
        Err(e) => {
            eprintln!("hako: {}", crate::show::message(&e.to_string()));
            Err(exit::SANDBOX_FAILED)
        }
    }
}

/// Runs `hako diff`.
pub fn run(args: DiffArgs) -> u8 {
    let (_state, layers) = match open(&args) {
        Ok(opened) => opened,
        Err(code) => return code,
    };
    let changes = match layers
        .changes_between()
        .map_err(Into::into)
        .and_then(|all| select(&layers, all, &args.paths))
    {
        Ok(changes) => changes,
        Err(e) => return review_failed(&e),
    };
    let hash = diff_hash(&changes);
    let text = if args.hash {
        format!("{hash}\n")
    } else if args.json {
        format!("{}\n", render::json(&layers, &changes))
    } else {
        let body = if args.stat {
            render::stat(&layers, &changes)
        } else {
            render::unified(&layers, &changes)
        };
        let body = if std::io::stdout().is_terminal() {
            for_terminal(&body)
        } else {
            body
        };
        format!("{body}# hash: {hash}\n")
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => 0,
        // A closed pipe (`| head`) is the reader's choice.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("hako: write the diff: {e}");
            exit::SANDBOX_FAILED
        }
    }
}

/// Each line with its controls escaped, tabs kept.
fn for_terminal(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (line, newline) = match line.strip_suffix('\n') {
            Some(l) => (l, "\n"),
            None => (line, ""),
        };
        let parts: Vec<String> = line
            .split('\t')
            .map(|part| crate::show::message(part).to_string())
            .collect();
        out.push_str(&parts.join("\t"));
        out.push_str(newline);
    }
    out
}
