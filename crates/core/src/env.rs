//! The environment a sandboxed command starts with.
//!
//! It is built from a minimal base plus an explicit allowlist. Names that look
//! like secrets never pass through a base list or a wildcard; they pass only
//! when named one by one.

/// Host variables every sandbox starts with, when the host has them and they
/// do not look like secrets.
pub const BASE_NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_COLLATE",
    "TERM",
    "TZ",
    "TMPDIR",
];

/// The `PATH` used when the host has none.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Whether a variable name looks like it carries a secret or a handle to
/// credentials (an agent socket, a cloud profile, the docker socket).
pub fn looks_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    const CONTAINS: &[&str] = &[
        "TOKEN",
        "SECRET",
        "PASSWORD",
        "PASSWD",
        "PASSPHRASE",
        "CREDENTIAL",
        "PRIVATE",
        "APIKEY",
        "API_KEY",
        "ACCESS_KEY",
        "COOKIE",
    ];
    const PREFIXES: &[&str] = &[
        "AWS_", "GCP_", "GCLOUD_", "GOOGLE_", "AZURE_", "ARM_", "DO_", "OCI_", "VAULT_",
    ];
    const EXACT: &[&str] = &[
        "SSH_AUTH_SOCK",
        "SSH_AGENT_PID",
        "GPG_AGENT_INFO",
        "DOCKER_HOST",
        "DOCKER_CONFIG",
        "KUBECONFIG",
        "NETRC",
        "PGPASS",
        "PGPASSFILE",
    ];
    CONTAINS.iter().any(|s| upper.contains(s))
        || PREFIXES.iter().any(|p| upper.starts_with(p))
        || EXACT.contains(&upper.as_str())
        || upper.ends_with("_KEY")
        || upper.ends_with("_PAT")
        || upper == "KEY"
}

/// Whether `name` is a valid environment variable name for a sandbox: not
/// empty, no `=` and no NUL.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

/// Which host variables pass into a sandbox, and what is set explicitly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvPolicy {
    /// Host variables to pass: an exact name passes even if it looks secret;
    /// a pattern ending in `*` (e.g. `LC_*`) passes only names that do not.
    pub pass: Vec<String>,
    /// Variables set explicitly, applied last (they win).
    pub set: Vec<(String, String)>,
}

impl EnvPolicy {
    /// Builds the base environment from the host's variables.
    ///
    /// Order of precedence, lowest first: the base names, then `pass`, then
    /// `set`. The result is sorted by name and has no duplicates.
    pub fn build<I>(&self, host: I) -> Vec<(String, String)>
    where
        I: IntoIterator<Item = (String, String)>,
    {
        let mut out: std::collections::BTreeMap<String, String> = Default::default();
        for (name, value) in host {
            if !valid_name(&name) || value.contains('\0') {
                continue;
            }
            let exact = self.pass.iter().any(|p| p == &name);
            let wildcard = self
                .pass
                .iter()
                .filter_map(|p| p.strip_suffix('*'))
                .any(|prefix| name.starts_with(prefix));
            let base = BASE_NAMES.contains(&name.as_str());
            if exact || ((base || wildcard) && !looks_secret(&name)) {
                out.insert(name, value);
            }
        }
        out.entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.into());
        for (name, value) in &self.set {
            out.insert(name.clone(), value.clone());
        }
        out.into_iter().collect()
    }
}

/// Merges `extra` over `base` (a later name replaces an earlier one).
pub fn merge(base: &[(String, String)], extra: &[(String, String)]) -> Vec<(String, String)> {
    let mut out: std::collections::BTreeMap<&str, &str> =
        base.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for (k, v) in extra {
        out.insert(k, v);
    }
    out.into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host() -> Vec<(String, String)> {
        [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/u"),
            ("GITHUB_TOKEN", "ghp"),
            ("OPENAI_API_KEY", "sk"),
            ("AWS_REGION", "eu"),
            ("SSH_AUTH_SOCK", "/tmp/agent"),
            ("DB_PASSWORD", "pw"),
            ("MY_SECRET_THING", "s"),
            ("EDITOR", "vi"),
            ("LC_ALL", "C"),
            ("LC_SECRET", "x"),
            ("CARGO_HOME", "/c"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn names(env: &[(String, String)]) -> Vec<&str> {
        env.iter().map(|(k, _)| k.as_str()).collect()
    }

    #[test]
    fn secrets_never_pass_by_default() {
        let env = EnvPolicy::default().build(host());
        assert_eq!(names(&env), ["HOME", "LC_ALL", "PATH"]);
    }

    #[test]
    fn wildcards_do_not_let_secrets_through() {
        let policy = EnvPolicy {
            pass: vec!["LC_*".into(), "AWS_*".into(), "*".into()],
            set: vec![],
        };
        let env = policy.build(host());
        let got = names(&env);
        assert!(got.contains(&"EDITOR"));
        assert!(got.contains(&"CARGO_HOME"));
        for secret in [
            "GITHUB_TOKEN",
            "OPENAI_API_KEY",
            "AWS_REGION",
            "SSH_AUTH_SOCK",
            "DB_PASSWORD",
            "LC_SECRET",
        ] {
            assert!(!got.contains(&secret), "{secret} leaked");
        }
    }

    #[test]
    fn a_secret_named_one_by_one_passes() {
        let policy = EnvPolicy {
            pass: vec!["GITHUB_TOKEN".into()],
            set: vec![("X".into(), "1".into())],
        };
        let env = policy.build(host());
        assert!(env.contains(&("GITHUB_TOKEN".into(), "ghp".into())));
        assert!(env.contains(&("X".into(), "1".into())));
        assert!(!names(&env).contains(&"OPENAI_API_KEY"));
    }

    #[test]
    fn path_has_a_default() {
        let env = EnvPolicy::default().build(Vec::new());
        assert_eq!(env, vec![("PATH".to_string(), DEFAULT_PATH.to_string())]);
    }

    #[test]
    fn secret_detection() {
        for name in [
            "GITHUB_TOKEN",
            "NPM_TOKEN",
            "ANTHROPIC_API_KEY",
            "aws_secret_access_key",
            "AWS_PROFILE",
            "GOOGLE_APPLICATION_CREDENTIALS",
            "SSH_AUTH_SOCK",
            "DOCKER_HOST",
            "PGPASSWORD",
            "SIGNING_KEY",
        ] {
            assert!(looks_secret(name), "{name}");
        }
        for name in ["PATH", "HOME", "TERM", "LANG", "RUST_LOG", "KEYBOARD"] {
            assert!(!looks_secret(name), "{name}");
        }
    }
}
