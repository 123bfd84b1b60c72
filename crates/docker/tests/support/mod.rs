//! Helpers the container test files share.

use std::process::Command as Process;

/// `docker ps -a` lines for containers whose name is `name`.
pub fn containers_named(name: &str) -> Vec<String> {
    let out = Process::new("docker")
        .args([
            "ps",
            "--all",
            "--filter",
            &format!("name=^{name}$"),
            "--format",
            "{{.Names}}",
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}
