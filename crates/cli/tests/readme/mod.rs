//! The README's examples, run as a user types them.

use std::path::PathBuf;
use std::process::Stdio;

use super::{dirs, hako, text};

/// `hako run --ro ~/.cargo --ro ~/.rustup -- cargo --version` in a `linux`
/// sandbox, with a rustup user's `PATH` (`~/.cargo/bin` first) and no
/// `RUSTUP_HOME` or `CARGO_HOME`: rustup finds its toolchain under the
/// sandbox's `HOME`, which is at the user's home path.
#[test]
fn the_readme_toolchain_example_runs_cargo_in_a_linux_sandbox() {
    let skip = |reason: String| {
        assert!(
            std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
            "{reason} and HAKO_MUST_WORK=1"
        );
        eprintln!("SKIPPED the_readme_toolchain_example_runs_cargo_in_a_linux_sandbox: {reason}");
    };
    let Some(home) = std::env::var_os("HOME").map(PathBuf::from) else {
        return skip("no HOME".into());
    };
    let (cargo_home, rustup_home) = (home.join(".cargo"), home.join(".rustup"));
    let has_toolchain = std::fs::read_dir(rustup_home.join("toolchains"))
        .is_ok_and(|mut d| d.next().is_some())
        && cargo_home.join("bin/cargo").is_file();
    if !has_toolchain {
        return skip(format!("no rustup toolchain in {}", home.display()));
    }
    if let Err(reason) = hako_sys::ns::user_namespaces_allowed() {
        return skip(format!("the linux backend cannot run here: {reason}"));
    }
    let d = dirs();
    let path = format!(
        "{}:{}",
        cargo_home.join("bin").display(),
        std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
    );
    let out = hako()
        .args(["run", "--backend", "linux", "--workspace"])
        .arg(&d.ws)
        .arg("--ro")
        .arg(&cargo_home)
        .arg("--ro")
        .arg(&rustup_home)
        .args(["--", "cargo", "--version"])
        .env("PATH", path)
        .env_remove("RUSTUP_HOME")
        .env_remove("CARGO_HOME")
        .env_remove("RUSTUP_TOOLCHAIN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("cargo "),
        "{stdout}{}",
        text(&out.stderr)
    );
}
