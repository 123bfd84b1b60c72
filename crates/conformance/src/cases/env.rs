//! What a command inherits: environment variables and file descriptors.

use hako_core::{Command, ExitStatus};
use hako_sys::rustix;

use crate::check::{expect_output, run, sh, show, Ctx};
use crate::harness::{SECRET_KEY_NAME, SECRET_NAME, SECRET_VALUE};

/// `printf %s "$NAME"` with the value exactly, `<unset>` when unset.
fn value_inside(h: &crate::Harness, command: Command, name: &str) -> crate::check::Res<String> {
    let out = run(h, &command)?;
    ensure_eq!(out.status, ExitStatus::Code(0), "print ${name}");
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn print(name: &str) -> Command {
    Command::shell(format!("printf %s \"${{{name}-<unset>}}\""))
}

case! {
    /// `Command::env` adds variables and overrides the base, values arrive
    /// byte for byte, and the last of two settings wins.
    fn command_env_adds_and_overrides_variables(h) {
        let value = "a b=c\n\td 'q\" $x";
        let got = value_inside(h, print("HAKO_ADDED").env("HAKO_ADDED", value), "HAKO_ADDED")?;
        ensure_eq!(got.as_str(), value, "an added variable");
        let got = value_inside(h, print("HOME").env("HOME", "/hako-home-override"), "HOME")?;
        ensure_eq!(got.as_str(), "/hako-home-override", "HOME overridden");
        let got = value_inside(h, print("PATH").env("PATH", "/usr/bin:/bin"), "PATH")?;
        ensure_eq!(got.as_str(), "/usr/bin:/bin", "PATH overridden");
        let got = value_inside(
            h,
            print("HAKO_TWICE").env("HAKO_TWICE", "first").env("HAKO_TWICE", "second"),
            "HAKO_TWICE",
        )?;
        ensure_eq!(got.as_str(), "second", "the later of two settings");
        let got = value_inside(h, print("HAKO_EMPTY").env("HAKO_EMPTY", ""), "HAKO_EMPTY")?;
        ensure_eq!(got.as_str(), "", "a variable set to the empty string");
        // An explicit setting is the caller's choice, even for a secret-looking name.
        let got = value_inside(
            h,
            print("HAKO_EXPLICIT_TOKEN").env("HAKO_EXPLICIT_TOKEN", "given"),
            "HAKO_EXPLICIT_TOKEN",
        )?;
        ensure_eq!(got.as_str(), "given", "an explicitly set secret-looking name");
        // Settings do not stick to the sandbox.
        let got = value_inside(h, print("HAKO_ADDED"), "HAKO_ADDED")?;
        ensure_eq!(got.as_str(), "<unset>", "a variable of an earlier command");
        Ok(())
    }
}

fn is_identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

case! {
    /// Secret-looking host variables (the harness sets
    /// `HAKO_CONFORMANCE_SECRET_TOKEN` and `HAKO_CONFORMANCE_API_KEY` in the
    /// test process before the sandbox is built, and any the host already
    /// has) are not visible inside; PATH is set.
    fn host_secrets_do_not_reach_the_command(h) {
        ensure_eq!(
            std::env::var(SECRET_NAME).ok().as_deref(),
            Some(SECRET_VALUE),
            "the canary is set in the test process"
        );
        let mut names: Vec<String> = std::env::vars_os()
            .filter_map(|(k, _)| k.into_string().ok())
            .filter(|k| hako_core::env::looks_secret(k) && is_identifier(k))
            .collect();
        names.sort();
        ensure!(
            names.iter().any(|n| n == SECRET_NAME) && names.iter().any(|n| n == SECRET_KEY_NAME),
            "the canaries do not look secret to hako_core::env::looks_secret: {names:?}"
        );
        let script: String = names
            .iter()
            .map(|n| format!("printf '%s=%s\\n' {n} \"${{{n}-<unset>}}\"\n"))
            .collect();
        let out = sh(h, &script)?;
        let expected: String = names.iter().map(|n| format!("{n}=<unset>\n")).collect();
        expect_output(&out, expected.as_bytes(), "secret-looking host variables inside")?;

        let out = run(h, &Command::new(["env"]))?;
        ensure_eq!(out.status, ExitStatus::Code(0), "env");
        let listing = String::from_utf8_lossy(&out.stdout);
        ensure!(
            !listing.contains(SECRET_VALUE),
            "the canary value is visible inside: {}",
            show(&out.stdout)
        );
        for line in listing.lines() {
            let Some((name, _)) = line.split_once('=') else { continue };
            ensure!(
                !(is_identifier(name) && hako_core::env::looks_secret(name)),
                "a secret-looking variable is set inside: {name}"
            );
        }
        let path = value_inside(h, print("PATH"), "PATH")?;
        ensure!(
            path != "<unset>" && !path.is_empty(),
            "PATH inside is {path:?}"
        );
        Ok(())
    }
}

case! {
    /// Only fds 0, 1 and 2 reach the command, even when the process that
    /// runs the sandbox holds inheritable (non-close-on-exec) descriptors.
    fn only_stdin_stdout_and_stderr_reach_the_command(h) {
        use rustix::fs::{Mode, OFlags};
        // Inheritable on purpose: no O_CLOEXEC.
        let null = rustix::fs::open("/dev/null", OFlags::RDONLY, Mode::empty())
            .ctx("open an inheritable /dev/null")?;
        let (pipe_r, pipe_w) = rustix::pipe::pipe().ctx("open an inheritable pipe")?;
        for fd in [&null, &pipe_r, &pipe_w] {
            let flags = rustix::io::fcntl_getfd(fd).ctx("F_GETFD")?;
            ensure!(
                !flags.contains(rustix::io::FdFlags::CLOEXEC),
                "the test's descriptor is close-on-exec, the check would prove nothing"
            );
        }
        // A subshell lists its parent's descriptors, so the descriptor the
        // glob itself opens is the subshell's, not the listed one's; the
        // trailing `:` keeps the subshell from being exec'd in place.
        let out = sh(h, "p=$$; (cd /proc/$p/fd && echo *); :")?;
        expect_output(&out, b"0 1 2\n", "descriptors of the command")?;
        // And with stdin attached (a pipe of its own).
        let out = run(
            h,
            &Command::new(["sh", "-c", "p=$$; (cd /proc/$p/fd && echo *); :"]).stdin(b"x".to_vec()),
        )?;
        expect_output(&out, b"0 1 2\n", "descriptors of a command with stdin")?;
        drop((null, pipe_r, pipe_w));
        Ok(())
    }
}
