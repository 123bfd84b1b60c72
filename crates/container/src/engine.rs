//! Which container runtime CLI drives the `docker` backend: Docker or
//! Podman, chosen by `HAKO_DOCKER` or by asking each whether it works.

use std::sync::Arc;

use hako_core::{Error, Result};

use crate::runner::Runner;

/// The variable that names the runtime CLI, with any leading words
/// (`sudo podman`).
pub const ENV_VAR: &str = "HAKO_DOCKER";

/// The CLI's dialect (Podman needs a few flags Docker does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// Docker (dockerd).
    Docker,
    /// Podman.
    Podman,
}

/// A container runtime CLI: the words that start it, and its dialect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// The program and its leading arguments (`["sudo", "podman"]`).
    pub argv: Vec<String>,
    /// Docker or Podman.
    pub kind: EngineKind,
}

impl Engine {
    /// An engine from the words of `HAKO_DOCKER`: Podman when the program
    /// (the last word) is named podman, Docker otherwise.
    pub fn from_words(words: &str) -> Option<Engine> {
        let argv: Vec<String> = words.split_whitespace().map(str::to_string).collect();
        let program = argv.last()?;
        let name = std::path::Path::new(program)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(program);
        let kind = if name.contains("podman") {
            EngineKind::Podman
        } else {
            EngineKind::Docker
        };
        Some(Engine { argv, kind })
    }

    /// `HAKO_DOCKER` when set; else `docker` if `docker info` works; else
    /// `podman` if `podman info` works; else an error saying what to
    /// install. When docker is installed and podman is not, docker is
    /// chosen without asking (its own error then says the daemon is down).
    pub fn choose(runner: &dyn Runner) -> Result<Engine> {
        if let Some(words) = std::env::var(ENV_VAR).ok().filter(|w| !w.trim().is_empty()) {
            return Engine::from_words(&words).ok_or_else(|| unavailable("HAKO_DOCKER is empty"));
        }
        // With no podman to fall back on, asking `docker info` first only
        // costs time: a daemon that is down is named by docker's own error
        // when the container starts.
        if on_path("docker") && !on_path("podman") {
            return Ok(Engine {
                argv: vec!["docker".into()],
                kind: EngineKind::Docker,
            });
        }
        let mut why = Vec::new();
        for (program, kind) in [
            ("docker", EngineKind::Docker),
            ("podman", EngineKind::Podman),
        ] {
            let engine = Engine {
                argv: vec![program.to_string()],
                kind,
            };
            match engine.works(runner) {
                Ok(()) => return Ok(engine),
                Err(reason) => why.push(format!("{program}: {reason}")),
            }
        }
        Err(unavailable(&format!(
            "no container runtime works here ({}); install docker.io and start dockerd, or install podman, or set {ENV_VAR} to the command to use (e.g. \"sudo podman\")",
            why.join("; ")
        )))
    }

    /// Whether `info` answers (for Docker, whether the daemon is up).
    pub fn works(&self, runner: &dyn Runner) -> std::result::Result<(), String> {
        let argv = self.command(["info", "--format", "{{.ServerVersion}}"]);
        match runner.output(&argv) {
            Ok(out) if out.success => Ok(()),
            Ok(out) => Err(first_line(&out.message())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err("not installed".into()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// The engine's argv followed by `args`.
    pub fn command<I, S>(&self, args: I) -> Vec<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv
            .iter()
            .cloned()
            .chain(args.into_iter().map(Into::into))
            .collect()
    }

    /// The program's name, for messages.
    pub fn name(&self) -> &'static str {
        match self.kind {
            EngineKind::Docker => "docker",
            EngineKind::Podman => "podman",
        }
    }
}

/// Whether `program` is an executable file in a `PATH` directory.
pub fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or("").trim().to_string()
}

fn unavailable(message: &str) -> Error {
    Error::Backend {
        backend: "docker".into(),
        op: "choose a container runtime",
        message: message.into(),
    }
}

/// The engine chosen once per process (`docker info` costs tens of
/// milliseconds): later sandboxes reuse it.
pub fn shared(runner: &dyn Runner) -> Result<Arc<Engine>> {
    static CHOSEN: std::sync::Mutex<Option<Arc<Engine>>> = std::sync::Mutex::new(None);
    let mut chosen = CHOSEN
        .lock()
        .map_err(|_| unavailable("engine lock poisoned"))?;
    if let Some(engine) = chosen.as_ref() {
        return Ok(Arc::clone(engine));
    }
    let engine = Arc::new(Engine::choose(runner)?);
    *chosen = Some(Arc::clone(&engine));
    Ok(engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hako_docker_words_pick_the_dialect() {
        let e = Engine::from_words("sudo podman").unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.argv, ["sudo", "podman"]);
        assert_eq!(e.kind, EngineKind::Podman);
        let e = Engine::from_words("/usr/bin/docker").unwrap_or_else(|| panic!("parsed"));
        assert_eq!(e.kind, EngineKind::Docker);
        assert!(Engine::from_words("   ").is_none());
    }
}
