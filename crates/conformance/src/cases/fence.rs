//! The fence against hostile paths: each case plants an attack from the
//! host side and tries it through every operation it applies to, checking
//! the exact refusal and that nothing changed, inside or outside.
//!
//! Mutating operations only ever aim at the harness's own sentinels (or
//! fresh names), never at a real system file: a fence bug must fail the
//! case, not damage the machine running it.

use std::path::{Path, PathBuf};

use crate::check::{refused, Fk, Op, Res};
use crate::harness::is_root;
use crate::Harness;

const READING: [Op; 5] = [Op::Read, Op::ReadLimit, Op::List, Op::Stat, Op::Cwd];
const CREATING: [Op; 3] = [Op::Write, Op::Append, Op::MakeDir];
const RESOLVING_FINAL: [Op; 4] = [Op::Read, Op::ReadLimit, Op::List, Op::Cwd];

/// The sandbox's absolute path of the workspace: its workdir, or the host
/// path when it reports none.
fn workdir(h: &Harness) -> PathBuf {
    h.sandbox()
        .workdir()
        .map(|w| w.workdir().to_path_buf())
        .unwrap_or_else(|| h.workspace().to_path_buf())
}

/// Checks that a fresh name outside was not created, removing it if it was.
fn not_created(path: &Path) -> Res {
    if path.symlink_metadata().is_ok() {
        let _ = std::fs::remove_file(path).or_else(|_| std::fs::remove_dir_all(path));
        fail!("{path:?} was created through the sandbox");
    }
    Ok(())
}

case! {
    /// `..` that climbs out of the root is refused lexically by every
    /// operation, even when it would land back inside.
    fn dot_dot_escape_is_refused_by_every_operation(h) {
        h.plant_file("f", b"inside")?;
        h.plant_dir("sub/deeper")?;
        for path in [
            "..",
            "../x",
            "a/../../x",
            "./../x",
            "sub/../../x",
            "sub/deeper/../../../outside/secret",
            "../outside/secret",
            "../outside",
            "../ws/f",
            "sub/..//../outside/dir/inner",
        ] {
            refused(h, Path::new(path), &Op::ALL, &[Fk::DotDotEscape])?;
        }
        not_created(&h.root().join("x"))
    }
}

case! {
    /// Absolute paths outside the workspace are refused by every operation:
    /// the outside sentinels, the directory above the workspace, a sibling
    /// whose name starts with the workspace's, and (for operations that only
    /// read) system files.
    fn absolute_path_outside_is_refused_by_every_operation(h) {
        let wd = workdir(h);
        let fresh = PathBuf::from(format!("/tmp/hako-conformance-{}", h.marker()));
        let mut sibling = wd.clone().into_os_string();
        sibling.push("X/secret");
        for path in [
            h.outside().join("secret"),
            h.outside().to_path_buf(),
            h.outside().join("dir/inner"),
            h.outside().join("new"),
            h.root().to_path_buf(),
            h.root().join("new"),
            PathBuf::from(sibling),
            fresh.clone(),
        ] {
            refused(h, &path, &Op::ALL, &[Fk::AbsoluteOutside])?;
        }
        for path in ["/etc/passwd", "/etc", "/", "/proc/self/root/etc/passwd"] {
            refused(h, Path::new(path), &READING, &[Fk::AbsoluteOutside])?;
        }
        refused(
            h,
            &wd.join("../outside/secret"),
            &Op::ALL,
            &[Fk::DotDotEscape, Fk::AbsoluteOutside],
        )?;
        not_created(&fresh)
    }
}

case! {
    /// A planted symlink whose target is outside (absolute, relative with
    /// `..`, from a subdirectory with `../..`, or the parent itself) is
    /// refused by every operation that follows it; `remove` removes the link
    /// and keeps the target, `stat` reports the link.
    fn symlink_to_outside_is_refused_by_every_operation(h) {
        let out = h.outside();
        h.plant_symlink("abs_file", out.join("secret"))?;
        h.plant_symlink("rel_file", "../outside/secret")?;
        h.plant_symlink("abs_dir", out)?;
        h.plant_symlink("rel_dir", "../outside")?;
        h.plant_dir("deep")?;
        h.plant_symlink("deep/rel", "../../outside/secret")?;
        h.plant_symlink("parent", "..")?;
        h.plant_symlink("abs_new", out.join("new"))?;
        let links = ["abs_file", "rel_file", "abs_dir", "rel_dir", "deep/rel", "parent", "abs_new"];
        for link in links {
            refused(h, Path::new(link), &Op::FOLLOWING, &[Fk::SymlinkEscape])?;
        }
        not_created(&out.join("new"))?;
        if let Some(stat) = h.sandbox().stat() {
            for link in links {
                let meta = stat.stat(Path::new(link));
                ensure!(
                    matches!(&meta, Ok(m) if m.kind == hako_core::FileKind::Symlink),
                    "stat {link}: got {meta:?}, expected the link itself"
                );
            }
        }
        for link in links {
            h.sandbox()
                .remove(Path::new(link))
                .map_err(|e| crate::Outcome::Failed(format!("remove {link}: {e:?}")))?;
            ensure!(
                h.host_path(link).symlink_metadata().is_err(),
                "remove {link} left the link"
            );
        }
        h.check_outside()
    }
}

case! {
    /// A symlink to outside in the middle of a path (`link/secret`, also
    /// reached through a chain of inside links) is refused by every
    /// operation, including `remove` and `stat`.
    fn symlink_to_outside_in_an_intermediate_component_is_refused(h) {
        h.plant_symlink("abs_dir", h.outside())?;
        h.plant_symlink("rel_dir", "../outside")?;
        h.plant_dir("sub")?;
        h.plant_symlink("sub/up", "../../outside")?;
        h.plant_symlink("hop", "sub/up")?;
        h.plant_symlink("parent", "..")?;
        h.plant_file("f", b"inside")?;
        for path in [
            "abs_dir/secret",
            "rel_dir/secret",
            "sub/up/secret",
            "hop/secret",
            "abs_dir/dir/inner",
            "rel_dir/dir/inner",
            "abs_dir/new",
            "rel_dir/dir/new",
            "hop/dir",
            "parent/outside/secret",
            "parent/ws/f",
        ] {
            refused(h, Path::new(path), &Op::ALL, &[Fk::SymlinkEscape])?;
        }
        not_created(&h.outside().join("new"))?;
        not_created(&h.outside().join("dir/new"))
    }
}

case! {
    /// Writing, appending or making a directory through a dangling symlink
    /// never creates its target, inside or outside; reading it is NotFound
    /// inside and an escape outside.
    fn dangling_symlink_never_creates_its_target(h) {
        h.plant_symlink("dang_in", "missing-target")?;
        h.plant_symlink("dang_deep", "nodir/missing")?;
        h.plant_symlink("dang_chain", "dang_in")?;
        h.plant_dir("sub")?;
        h.plant_symlink("sub/dang_up", "../missing-up")?;
        for link in ["dang_in", "dang_deep", "dang_chain", "sub/dang_up"] {
            refused(h, Path::new(link), &CREATING, &[Fk::DanglingSymlink])?;
            refused(h, Path::new(link), &RESOLVING_FINAL, &[Fk::NotFound])?;
        }
        for target in ["missing-target", "nodir", "missing-up"] {
            ensure!(
                h.host_path(target).symlink_metadata().is_err(),
                "the dangling symlink's target {target} was created"
            );
        }
        h.plant_symlink("dang_out_rel", "../outside/newfile")?;
        h.plant_symlink("dang_out_abs", h.outside().join("newfile"))?;
        h.plant_symlink("dang_out_dir", "../outside/newdir/x")?;
        for link in ["dang_out_rel", "dang_out_abs", "dang_out_dir"] {
            refused(h, Path::new(link), &Op::FOLLOWING, &[Fk::SymlinkEscape])?;
        }
        not_created(&h.outside().join("newfile"))?;
        not_created(&h.outside().join("newdir"))
    }
}

case! {
    /// Symlink loops (two links, a self link, a loop through `..`) are
    /// refused (as `MagicLink`, which covers loops) by every operation.
    fn symlink_loop_is_refused(h) {
        h.plant_symlink("loop_a", "loop_b")?;
        h.plant_symlink("loop_b", "loop_a")?;
        h.plant_symlink("self", "self")?;
        h.plant_dir("sub")?;
        h.plant_symlink("deep_loop", "sub/../deep_loop")?;
        for link in ["loop_a", "self", "deep_loop"] {
            refused(h, Path::new(link), &Op::FOLLOWING, &[Fk::MagicLink])?;
            refused(h, &Path::new(link).join("x"), &Op::ALL, &[Fk::MagicLink])?;
        }
        Ok(())
    }
}

case! {
    /// Symlinks planted to `/proc/self/root`, `/proc/self/fd/0`,
    /// `/proc/self/cwd` and `/proc/self/exe` are refused (as an escape or as
    /// a magic link) by every operation that follows them.
    fn magic_link_symlinks_into_proc_are_refused(h) {
        h.plant_symlink("proc_root", "/proc/self/root")?;
        h.plant_symlink("proc_fd0", "/proc/self/fd/0")?;
        h.plant_symlink("proc_cwd", "/proc/self/cwd")?;
        h.plant_symlink("proc_exe", "/proc/self/exe")?;
        let kinds = [Fk::SymlinkEscape, Fk::MagicLink];
        let via_root = |rel: &Path| -> PathBuf {
            let mut path = PathBuf::from("proc_root").into_os_string();
            path.push(rel.as_os_str());
            PathBuf::from(path)
        };
        refused(h, &via_root(&h.outside().join("secret")), &Op::ALL, &kinds)?;
        refused(h, &via_root(&h.outside().join("new")), &Op::ALL, &kinds)?;
        refused(h, Path::new("proc_root/etc/passwd"), &READING, &kinds)?;
        refused(h, Path::new("proc_root"), &RESOLVING_FINAL, &kinds)?;
        refused(h, Path::new("proc_fd0"), &Op::FOLLOWING, &kinds)?;
        refused(h, Path::new("proc_cwd"), &RESOLVING_FINAL, &kinds)?;
        refused(h, Path::new("proc_exe"), &RESOLVING_FINAL, &kinds)?;
        not_created(&h.outside().join("new"))
    }
}

/// Unmounts a procfs mounted inside the workspace, even if the case fails.
fn mount_proc(h: &Harness, rel: &str) -> Res<bool> {
    h.plant_dir(rel)?;
    let target = h.host_path(rel);
    let out = std::process::Command::new("mount")
        .args(["-t", "proc", "proc"])
        .arg(&target)
        .output();
    match out {
        Ok(out) if out.status.success() => {
            h.defer(move || {
                let _ = std::process::Command::new("umount")
                    .arg("-l")
                    .arg(&target)
                    .status();
            });
            Ok(true)
        }
        Ok(out) => {
            eprintln!(
                "mount -t proc failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            Ok(false)
        }
        Err(e) => {
            eprintln!("cannot run mount: {e}");
            Ok(false)
        }
    }
}

case! {
    /// With a real procfs mounted inside the workspace,
    /// `proc/self/root/...`, `proc/<pid>/root/...` and `proc/self/fd/0` never
    /// leave the root lexically, and are still refused as magic links, by
    /// every operation (also through a relative symlink to them).
    fn procfs_mounted_inside_the_workspace_cannot_be_used_to_escape(h) {
        if !is_root() {
            skip!("mounting procfs inside the workspace needs root");
        }
        if !mount_proc(h, "proc")? {
            skip!("mount -t proc failed (see stderr)");
        }
        h.plant_symlink("to_root", "proc/self/root")?;
        h.plant_symlink("to_fd0", "proc/self/fd/0")?;
        let magic = [Fk::MagicLink];
        let through = |prefix: &str, rest: &Path| -> PathBuf {
            let mut path = PathBuf::from(prefix).into_os_string();
            path.push(rest.as_os_str());
            PathBuf::from(path)
        };
        let secret = h.outside().join("secret");
        let new = h.outside().join("new");
        // By pid as well as through `self` (a plain symlink inside procfs):
        // this process's own pid, which it may always inspect (another
        // process's `root` can be refused earlier with EACCES).
        let by_pid = format!("proc/{}/root", std::process::id());
        for prefix in ["proc/self/root", "proc/thread-self/root", by_pid.as_str(), "to_root"] {
            refused(h, &through(prefix, &secret), &Op::ALL, &magic)?;
            refused(h, &through(prefix, &new), &Op::ALL, &magic)?;
            refused(h, &through(prefix, Path::new("/etc/passwd")), &READING, &magic)?;
            refused(h, &through(prefix, Path::new("/etc")), &READING, &magic)?;
        }
        for path in ["proc/self/root", "proc/self/cwd", "proc/self/fd/0", "proc/self/exe", "to_fd0"] {
            refused(h, Path::new(path), &RESOLVING_FINAL, &magic)?;
            refused(h, Path::new(path), &[Op::MakeDir], &magic)?;
        }
        // Writing or appending to a final magic link may be refused as the
        // magic link, or as what the link's text points at; never followed.
        for path in ["proc/self/fd/0", "to_fd0"] {
            refused(
                h,
                Path::new(path),
                &[Op::Write, Op::Append],
                &[Fk::MagicLink, Fk::SymlinkEscape, Fk::DanglingSymlink],
            )?;
        }
        not_created(&new)
    }
}

case! {
    /// A NUL byte anywhere in a path is refused by every operation.
    fn nul_byte_in_a_path_is_refused(h) {
        h.plant_file("f", b"inside")?;
        for path in ["a\0b", "\0", "sub/\0/x", "f\0../../outside/secret", "f\0"] {
            refused(h, Path::new(path), &Op::ALL, &[Fk::NulByte])?;
        }
        Ok(())
    }
}

case! {
    /// A path over 4095 bytes and a component over 255 bytes are refused by
    /// every operation, as too long, naming which.
    fn over_long_paths_and_components_are_refused(h) {
        let long_name = "n".repeat(256);
        for path in ["a/".repeat(2100), "./".repeat(2100), format!("{}/x", "y".repeat(4095))] {
            refused(h, Path::new(&path), &Op::ALL, &[Fk::TooLongPath])?;
        }
        for path in [long_name.clone(), format!("sub/{long_name}"), format!("{long_name}/x")] {
            refused(h, Path::new(&path), &Op::ALL, &[Fk::TooLongComponent])?;
        }
        Ok(())
    }
}
