//! Profiles: the sandbox flags as TOML keys (`--profile FILE`), so that a
//! harness writes its policy once. Every field of [`SandboxFlags`] but
//! `profile` has a key of the same name (with `_` for `-`); a flag given on
//! the command line wins over the key, and list flags (`env`, `pass_env`, `ro`, `rw`,
//! `allow`, `resolve`) add to the profile's lists. Two more keys are
//! flags of the front ends rather than of the sandbox: `timeout` (`hako
//! run --timeout`) and `audit` (`--audit FILE` of `hako run`, `mcp` and
//! `serve`). An unknown key is an error that names it and lists the keys
//! there are; an unknown value lists the valid ones.
//!
//! ```toml
//! backend = "linux"
//! net = "allow"
//! allow = ["pypi.org", "files.pythonhosted.org", "localhost:11434"]
//! memory = "2G"
//! pids = 512
//! cpus = 2
//! env = { PIP_NO_INPUT = "1" }
//! ```
//!
//! [`SandboxFlags`]: crate::SandboxFlags

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// A number or a string with a unit (`"512M"`, `2`, `"0.5"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Scalar {
    /// A whole number.
    Int(u64),
    /// A decimal number.
    Float(f64),
    /// Text, parsed as the flag would be.
    Text(String),
}

impl Scalar {
    /// The value as the flag's text.
    pub fn text(&self) -> String {
        match self {
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Text(s) => s.clone(),
        }
    }
}

/// The keys of a profile, one per sandbox flag.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// `--backend`.
    pub backend: Option<String>,
    /// `--workspace` (relative to the profile's directory).
    pub workspace: Option<PathBuf>,
    /// `--env K=V`, as a table.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// `--pass-env`.
    #[serde(default)]
    pub pass_env: Vec<String>,
    /// `--max-output`.
    pub max_output: Option<Scalar>,
    /// `--memory`.
    pub memory: Option<Scalar>,
    /// `--pids`.
    pub pids: Option<Scalar>,
    /// `--cpus`.
    pub cpus: Option<Scalar>,
    /// `--max-file-size`.
    pub max_file_size: Option<Scalar>,
    /// `--max-open-files`.
    pub max_open_files: Option<Scalar>,
    /// `--ro`.
    #[serde(default)]
    pub ro: Vec<PathBuf>,
    /// `--rw`.
    #[serde(default)]
    pub rw: Vec<PathBuf>,
    /// `--best-effort`.
    pub best_effort: Option<bool>,
    /// `--image`.
    pub image: Option<String>,
    /// `--runtime`.
    pub runtime: Option<String>,
    /// `--no-guest`.
    pub no_guest: Option<bool>,
    /// `--net`.
    pub net: Option<String>,
    /// `--allow`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// `--resolve NAME=ADDR`, as a table.
    #[serde(default)]
    pub resolve: BTreeMap<String, String>,
    /// `--min-isolation`.
    pub min_isolation: Option<String>,
    /// `--max-sessions`.
    pub max_sessions: Option<Scalar>,
    /// `--max-processes`.
    pub max_processes: Option<Scalar>,
    /// `--cow`.
    pub cow: Option<bool>,
    /// `--name`: the copy-on-write sandbox's name.
    pub name: Option<String>,
    /// `--state`: where named sandboxes are kept.
    pub state: Option<PathBuf>,
    /// `--timeout` of `hako run`: the command's deadline (`"30s"`, `"2m"`;
    /// a bare number is seconds).
    pub timeout: Option<Scalar>,
    /// `--audit FILE` of `hako run`, `mcp` and `serve` (relative to the
    /// profile's directory).
    pub audit: Option<PathBuf>,
}

impl Profile {
    /// Reads and checks a profile file; relative paths in it are taken
    /// from the file's directory.
    pub fn load(path: &Path) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the profile {}: {e}", path.display()))?;
        let mut profile: Profile = toml::from_str(&text).map_err(|e| {
            // Where: the line (and its text), since a type error does
            // not name its key.
            let place = e
                .span()
                .map(|span| {
                    let start = span.start.min(text.len());
                    let line_no = text[..start].matches('\n').count() + 1;
                    let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
                    format!(", line {line_no} (`{line}`)")
                })
                .unwrap_or_default();
            format!("profile {}{place}: {}", path.display(), e.message())
        })?;
        let base = path.parent().unwrap_or(Path::new("."));
        let absolute = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        if let Some(ws) = profile.workspace.as_mut() {
            absolute(ws);
        }
        if let Some(state) = profile.state.as_mut() {
            absolute(state);
        }
        if let Some(audit) = profile.audit.as_mut() {
            absolute(audit);
        }
        profile.ro.iter_mut().for_each(absolute);
        profile.rw.iter_mut().for_each(absolute);
        Ok(profile)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn parse(text: &str) -> Result<Profile, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        std::fs::write(&path, text).unwrap();
        Profile::load(&path)
    }

    #[test]
    fn every_key_parses_and_relative_paths_follow_the_file() {
        let p = parse(
            r#"
            backend = "linux"
            workspace = "ws"
            env = { A = "1" }
            pass_env = ["LANG"]
            max_output = "2M"
            memory = "1G"
            pids = 64
            cpus = 0.5
            max_file_size = 1048576
            max_open_files = 256
            ro = ["/opt", "tools"]
            rw = []
            best_effort = true
            image = "img"
            runtime = "runsc"
            no_guest = false
            net = "allow"
            allow = ["pypi.org", "localhost:11434"]
            resolve = { "pkg.test" = "198.51.100.2" }
            min_isolation = "process"
            max_sessions = 4
            max_processes = 8
            cow = true
            name = "fix-1"
            state = "state"
            timeout = "2m"
            audit = "logs/audit.log"
            "#,
        )
        .unwrap();
        assert_eq!(p.timeout.unwrap().text(), "2m");
        let audit = p.audit.unwrap();
        assert!(audit.is_absolute() && audit.ends_with("logs/audit.log"));
        assert_eq!(p.backend.as_deref(), Some("linux"));
        assert!(p.workspace.unwrap().ends_with("ws"));
        assert_eq!(p.ro[0], PathBuf::from("/opt"));
        assert!(p.ro[1].is_absolute() && p.ro[1].ends_with("tools"));
        assert_eq!(p.cpus.unwrap().text(), "0.5");
        assert_eq!(p.max_file_size.unwrap().text(), "1048576");
        assert_eq!(p.allow.len(), 2);
        assert_eq!(p.resolve["pkg.test"], "198.51.100.2");
        assert_eq!(p.min_isolation.as_deref(), Some("process"));
        assert_eq!(p.max_sessions.unwrap().text(), "4");
        assert_eq!(p.max_processes.unwrap().text(), "8");
        assert_eq!((p.cow, p.name.as_deref()), (Some(true), Some("fix-1")));
        assert!(p.state.unwrap().is_absolute());
    }

    #[test]
    fn an_unknown_key_is_named_with_the_keys_there_are() {
        let err = parse("netwrok = \"allow\"\n").unwrap_err();
        assert!(err.contains("netwrok"), "{err}");
        for known in ["`net`", "`min_isolation`", "`timeout`", "`audit`"] {
            assert!(err.contains(known), "{err}");
        }
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_line() {
        let err = parse("net = \"none\"\nbest_effort = \"yes\"\n").unwrap_err();
        assert!(
            err.contains("line 2 (`best_effort = \"yes\"`)") && err.contains("boolean"),
            "{err}"
        );
    }
}
