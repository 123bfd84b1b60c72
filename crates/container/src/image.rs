//! Images without a registry: a minimal root file system built from the
//! host's statically linked busybox, kept as a directory (the `gvisor`
//! backend's `--image DIR`) and imported into Docker or Podman as an image
//! (`docker import`), since no registry can be reached.

use std::io::Write;
use std::path::{Path, PathBuf};

use hako_core::{Error, Result};

use crate::common::is_static_elf;
use crate::engine::Engine;
use crate::runner::Runner;

/// Where Debian's `busybox-static` puts the binary.
pub const DEFAULT_BUSYBOX: &str = "/bin/busybox";

fn failed(op: &'static str, message: impl Into<String>) -> Error {
    Error::Backend {
        backend: "image".into(),
        op,
        message: message.into(),
    }
}

/// The image `hako image build` makes when none is named (the `docker`
/// backend's default image, with the tag `latest`).
pub const DEFAULT_NAME: &str = "hako-busybox";

/// Where an image's directory is kept: `$XDG_DATA_HOME/hako/images/NAME`,
/// else `~/.local/share/hako/images/NAME`.
pub fn default_dir(name: &str) -> Option<PathBuf> {
    let base = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))?;
    Some(base.join("hako/images").join(name))
}

/// What an image is built from.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// A statically linked busybox.
    pub busybox: PathBuf,
    /// The directory the root file system is written to (replaced).
    pub dir: PathBuf,
}

/// The directories every image has (mount points and a writable-looking
/// layout for programs that expect them).
const DIRS: &[&str] = &[
    "bin", "dev", "etc", "home", "proc", "root", "sys", "tmp", "usr/bin", "usr/sbin", "sbin",
    "var/tmp",
];

/// Writes the root file system: busybox and a link per applet, `/etc`
/// basics, and the mount points. Returns the number of applets linked.
pub fn build_rootfs(spec: &ImageSpec) -> Result<usize> {
    let io = |op: &'static str| move |e: std::io::Error| failed(op, e.to_string());
    match is_static_elf(&spec.busybox) {
        Some(true) => {}
        Some(false) => {
            return Err(failed(
                "check busybox",
                format!(
                    "{} is dynamically linked; install busybox-static (Debian) or pass a static busybox",
                    spec.busybox.display()
                ),
            ))
        }
        None => {
            return Err(failed(
                "check busybox",
                format!(
                    "{} is not a readable executable; install busybox-static (Debian)",
                    spec.busybox.display()
                ),
            ))
        }
    }
    let out = std::process::Command::new(&spec.busybox)
        .arg("--list")
        .output()
        .map_err(io("list busybox applets"))?;
    let applets: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter(|a| *a != "busybox" && !a.contains('/'))
        .map(str::to_string)
        .collect();
    if applets.is_empty() {
        return Err(failed(
            "list busybox applets",
            "busybox --list printed nothing",
        ));
    }
    if spec.dir.exists() {
        std::fs::remove_dir_all(&spec.dir).map_err(io("replace the image directory"))?;
    }
    for dir in DIRS {
        std::fs::create_dir_all(spec.dir.join(dir)).map_err(io("create the image"))?;
    }
    use std::os::unix::fs::PermissionsExt;
    for tmp in ["tmp", "var/tmp"] {
        std::fs::set_permissions(spec.dir.join(tmp), std::fs::Permissions::from_mode(0o1777))
            .map_err(io("create the image"))?;
    }
    let target = spec.dir.join("bin/busybox");
    std::fs::copy(&spec.busybox, &target).map_err(io("copy busybox"))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755))
        .map_err(io("copy busybox"))?;
    for applet in &applets {
        std::os::unix::fs::symlink("busybox", spec.dir.join("bin").join(applet))
            .map_err(io("link busybox applets"))?;
    }
    let files: [(&str, &str); 4] = [
        (
            "etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        ),
        ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
        ("etc/hostname", "hako\n"),
        ("etc/hosts", "127.0.0.1 localhost hako\n::1 localhost\n"),
    ];
    for (path, text) in files {
        std::fs::write(spec.dir.join(path), text).map_err(io("write /etc"))?;
    }
    Ok(applets.len())
}

/// Imports the directory as image `name` (`docker import`, through a tar
/// stream written here), with a `PATH` set.
pub fn import(engine: &Engine, runner: &dyn Runner, dir: &Path, name: &str) -> Result<()> {
    let valid = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "._-/:".contains(c))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric());
    if !valid {
        return Err(failed(
            "import the image",
            format!("{name:?} is not an image name (letters, digits, '.', '_', '-', '/', ':')"),
        ));
    }
    let argv = engine.command([
        "import",
        "--change",
        &format!("ENV PATH={}", hako_core::env::DEFAULT_PATH),
        "-",
        name,
    ]);
    let mut child = runner.spawn(&argv).map_err(|e| {
        failed(
            "import the image",
            format!("cannot run {}: {e}", engine.name()),
        )
    })?;
    let tar = std::process::Command::new("tar")
        .args(["--numeric-owner", "-C"])
        .arg(dir)
        .args(["-c", "."])
        .output()
        .map_err(|e| failed("import the image", format!("cannot run tar: {e}")))?;
    if !tar.status.success() {
        return Err(failed(
            "import the image",
            format!(
                "tar failed: {}",
                String::from_utf8_lossy(&tar.stderr).trim()
            ),
        ));
    }
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(&tar.stdout)
            .map_err(|e| failed("import the image", e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed("import the image", e.to_string()))?;
    if !out.status.success() {
        return Err(failed(
            "import the image",
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(())
}

/// Whether `tag` is present in the engine's local images.
pub fn present(engine: &Engine, runner: &dyn Runner, tag: &str) -> Result<bool> {
    let out = runner
        .output(&engine.command(["image", "inspect", "--format", "{{.Id}}", tag]))
        .map_err(|e| match hako_sys::exhaust::diagnose(&e) {
            Some(found) => Error::OutOfResources {
                op: "look for the image",
                resource: found.resource,
                message: found.message,
            },
            None => failed(
                "look for the image",
                format!("cannot run {}: {e}", engine.name()),
            ),
        })?;
    Ok(out.success)
}

/// What stops hako from building its default image by itself, with the
/// one command that fixes it, or `None` when it can.
pub fn cannot_build_default() -> Option<String> {
    cannot_build_from(Path::new(DEFAULT_BUSYBOX))
}

/// [`cannot_build_default`] with `busybox` the one to build from.
fn cannot_build_from(busybox: &Path) -> Option<String> {
    match is_static_elf(busybox) {
        Some(true) => None,
        _ => Some(format!(
            "hako builds its default image from a static busybox, and {} is not one: run `sudo apt-get install busybox-static` (Debian, Ubuntu), or build an image of your own and pass --image",
            busybox.display()
        )),
    }
}

/// Makes sure the default image (`DEFAULT_NAME:latest`, or `tag`) is in
/// the engine: when it is missing, builds it as `hako image build` does
/// (from the host's static busybox, in a directory of hako's private
/// directory removed afterwards) and imports it, saying so on stderr. Once
/// present it is not asked again by this process. Returns whether it was
/// built now. Where it cannot be built, the error says the one command to
/// run.
pub fn ensure_default(engine: &Engine, runner: &dyn Runner, tag: &str) -> Result<bool> {
    ensure_built_from(engine, runner, tag, Path::new(DEFAULT_BUSYBOX))
}

/// [`ensure_default`], building from `busybox`.
pub fn ensure_built_from(
    engine: &Engine,
    runner: &dyn Runner,
    tag: &str,
    busybox: &Path,
) -> Result<bool> {
    // One build at a time in this process (a server opens sandboxes on
    // many threads), and each tag is asked once it is known present.
    static KNOWN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut known = KNOWN
        .lock()
        .map_err(|_| failed("look for the image", "lock poisoned"))?;
    let key = format!("{}\0{tag}", engine.name());
    if known.contains(&key) {
        return Ok(false);
    }
    if present(engine, runner, tag)? {
        known.push(key);
        return Ok(false);
    }
    if let Some(why) = cannot_build_from(busybox) {
        return Err(failed(
            "build the default image",
            format!("the {} image {tag} is not present; {why}", engine.name()),
        ));
    }
    let private = crate::private::private_dir()
        .map_err(|e| failed("build the default image", e.to_string()))?;
    let dir = private.join(format!(
        "image-build-{}",
        crate::common::unique_name("default")
    ));
    eprintln!(
        "hako: the {} image {tag} is not present: building it from {} (once; `hako image build` does the same)",
        engine.name(),
        busybox.display()
    );
    let spec = ImageSpec {
        busybox: busybox.to_path_buf(),
        dir: dir.clone(),
    };
    let built = build_rootfs(&spec).and_then(|applets| {
        eprintln!(
            "hako: root directory written (busybox, {applets} applets); importing it into {}",
            engine.name()
        );
        import(engine, runner, &dir, tag)
    });
    let _ = std::fs::remove_dir_all(&dir);
    built?;
    eprintln!("hako: {} image {tag} built", engine.name());
    known.push(key);
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rootfs_has_a_shell_and_the_mount_points() {
        let busybox = PathBuf::from(DEFAULT_BUSYBOX);
        if is_static_elf(&busybox) != Some(true) {
            eprintln!("SKIPPED: no static busybox here");
            assert!(
                std::env::var_os("HAKO_MUST_WORK").is_none(),
                "busybox-static is missing"
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let spec = ImageSpec {
            busybox,
            dir: dir.path().join("rootfs"),
        };
        let applets = build_rootfs(&spec).unwrap_or_else(|e| panic!("{e}"));
        assert!(applets > 100, "{applets} applets");
        for path in ["bin/sh", "bin/ls", "tmp", "proc", "etc/passwd"] {
            assert!(
                spec.dir.join(path).symlink_metadata().is_ok(),
                "{path} missing"
            );
        }
        let out = std::process::Command::new(spec.dir.join("bin/sh"))
            .args(["-c", "echo ok"])
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.stdout, b"ok\n");
        // Building again replaces it.
        build_rootfs(&spec).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_dynamic_busybox_is_refused() {
        let me = std::env::current_exe().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let err = build_rootfs(&ImageSpec {
            busybox: me,
            dir: dir.path().join("rootfs"),
        })
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(err.contains("dynamically linked"), "{err}");
    }
}
