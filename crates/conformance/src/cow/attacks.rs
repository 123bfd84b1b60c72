//! The attacks on a copy-on-write sandbox and its review (issue 23, item
//! 6), each named after itself, made from inside the sandbox (and, where
//! a hostile layer is the attack, by crafting its upper layer from the
//! host, as a process that could reach it would).

use std::io;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use hako_core::Sandbox;
use hako_layers::{diff_hash, render, CommitError, Node, Status};
use hako_sys::rustix::fs::{self as rfs, FileType, Mode};

use super::world::{ok, ok_with_stdin, run, same_view, statuses, view, World, SECRET};
use super::CowFactory;
use crate::check::{Ctx, Res};

/// A `cpio -i` archive (newc) of one unix socket named `name`: busybox's
/// `cpio` makes it with `mknod`, as any unprivileged process may, so a
/// socket is made inside without a program that binds one.
fn socket_archive(name: &str) -> Vec<u8> {
    fn entry(out: &mut Vec<u8>, name: &str, mode: u32) {
        let fields = [1, mode, 0, 0, 1, 0, 0, 0, 0, 0, 0, name.len() as u32 + 1, 0];
        out.extend_from_slice(b"070701");
        for f in fields {
            out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        while out.len() % 4 != 0 {
            out.push(0);
        }
    }
    let mut out = Vec::new();
    entry(&mut out, name, 0o140644);
    entry(&mut out, "TRAILER!!!", 0);
    out
}

/// `cpio -i`, busybox's where there is one.
const CPIO: &str = "if command -v busybox >/dev/null; then busybox cpio -i; else cpio -i; fi";

/// Fails unless `result` is a refusal of `path`.
fn refused<T: std::fmt::Debug>(result: Result<T, CommitError>, path: &str) -> Res {
    match result {
        Err(CommitError::Refused { path: p, why }) => {
            ensure!(
                p == Path::new(path),
                "refused {p:?} ({why}), expected {path}"
            );
            Ok(())
        }
        other => fail!("committing {path} was not refused: {other:?}"),
    }
}

pub(crate) fn a_symlink_in_the_layer_pointing_outside_is_committed_as_a_symlink_and_never_followed(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, |ws| std::fs::write(ws.join("f"), "f\n"))?;
    let before = w.snapshot_ws()?;
    let secret = w.outside.join("secret");
    let out = w.outside.display().to_string();
    let sb = w.open()?;
    // New symlinks out (absolute, relative, to a file and a directory),
    // and a workspace file replaced by one.
    ok(
        sb.sb(),
        &format!(
            "set -e; ln -s '{out}/secret' out; rm f; ln -s '{out}/secret' f; \
             ln -s '{out}' dirlink; ln -s ../outside/secret rel; ln -s ../outside reldir"
        ),
    )?;
    // Writing through them inside reaches only what the sandbox sees
    // there (nothing of the host's outside).
    let _ = run(
        sb.sb(),
        "echo through > f; echo through > out; echo x > dirlink/new; echo x > reldir/new; true",
    )?;
    sb.close()?;
    w.ws_unchanged(&before, "by making symlinks out")?;
    w.outside_unchanged()?;
    let changes = w.changes()?;
    ensure_eq!(
        statuses(&changes),
        vec![
            ("dirlink".to_string(), Status::Added),
            ("f".into(), Status::TypeChanged),
            ("out".into(), Status::Added),
            ("rel".into(), Status::Added),
            ("reldir".into(), Status::Added),
        ],
        "the changes"
    );
    w.commit(&[], Some(&diff_hash(&changes)))?
        .ctx("commit the symlinks")?;
    for (name, target) in [
        ("out", secret.clone()),
        ("f", secret.clone()),
        ("dirlink", w.outside.clone()),
        ("rel", "../outside/secret".into()),
        ("reldir", "../outside".into()),
    ] {
        let got = std::fs::read_link(w.ws.join(name)).ok();
        ensure_eq!(got, Some(target), "{name} after the commit");
    }
    w.outside_unchanged()?;
    // The sandbox now replaces each link with a file or directory of its
    // own: the commit replaces the symlink, never writing where it points.
    let sb = w.open()?;
    ok(
        sb.sb(),
        "set -e; rm out f rel dirlink reldir; echo mine > out; echo mine > f; \
         mkdir rel dirlink reldir; echo y > rel/secret; echo y > dirlink/secret; echo y > reldir/inner",
    )?;
    let seen = view(sb.sb())?;
    sb.close()?;
    w.commit(&[], None)?.ctx("commit files over the symlinks")?;
    same_view(
        &w.ws_view()?,
        &seen,
        "the workspace after the second commit",
    )?;
    let secret_now = std::fs::read(&secret).ctx("read outside/secret")?;
    ensure!(
        secret_now == SECRET,
        "outside/secret was written through a symlink"
    );
    w.finish(None)
}

pub(crate) fn a_device_fifo_socket_setuid_or_setgid_file_made_in_the_layer_is_refused_at_commit(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, |_| Ok(()))?;
    let before = w.snapshot_ws()?;
    let sb = w.open()?;
    ok(
        sb.sb(),
        "set -e; echo x > ordinary; mkfifo fifo; \
         printf '#!/bin/sh\\n' > suid; chmod 4755 suid; \
         printf '#!/bin/sh\\n' > sgid; chmod 2755 sgid; \
         mknod dev c 1 3 2>/dev/null || true",
    )?;
    ok_with_stdin(sb.sb(), CPIO, socket_archive("sock"))?;
    // The fifo, the socket and the set-user-ID file must really be made:
    // their refusal at commit is what is tested. A device node and a
    // set-group-ID bit the sandbox itself refuses count as refused.
    let made = ok(
        sb.sb(),
        "test -p fifo && echo fifo; test -S sock && echo sock; test -u suid && echo suid; \
         test -g sgid && echo sgid; test -c dev -o -b dev && echo dev; true",
    )?;
    let made: Vec<&str> = made.lines().collect();
    for must in ["fifo", "sock", "suid"] {
        ensure!(
            made.contains(&must),
            "the sandbox did not make {must} (made {made:?}): the case cannot test its refusal"
        );
    }
    sb.close()?;
    w.ws_unchanged(&before, "by making special files")?;
    let layers = w.layers()?;
    let changes = layers.changes().ctx("list the changes")?;
    let mut specials: Vec<&str> = ["dev", "fifo", "sgid", "sock", "suid"]
        .into_iter()
        .filter(|name| made.contains(name))
        .collect();
    // gVisor keeps a FIFO or socket made on a host-backed file system in
    // its own kernel's memory: nothing reaches the layer, so there is
    // nothing to review or commit. Then no later sandbox may see it.
    let in_memory: Vec<&str> = ["fifo", "sock"]
        .into_iter()
        .filter(|name| made.contains(name) && !changes.iter().any(|c| c.path == Path::new(name)))
        .collect();
    if !in_memory.is_empty() {
        let sb = w.open()?;
        let seen = ok(
            sb.sb(),
            "test -e fifo && echo fifo; test -e sock && echo sock; true",
        )?;
        sb.close()?;
        for name in &in_memory {
            ensure!(
                !seen.lines().any(|l| l == *name),
                "{name} is in no layer, yet a new sandbox sees it"
            );
        }
        specials.retain(|name| !in_memory.contains(name));
    }
    for name in &specials {
        let change = changes
            .iter()
            .find(|c| c.path == Path::new(name))
            .ctx(format!("the diff does not list {name}"))?;
        ensure!(
            change.refusal().is_some(),
            "{name} is listed but not marked refused: {change:?}"
        );
    }
    if !made.contains(&"sgid") {
        // Made without the bit: listed as the plain file it is.
        let sgid = changes.iter().find(|c| c.path == Path::new("sgid"));
        ensure!(
            matches!(sgid.and_then(|c| c.new.as_ref()), Some(Node::File { mode, .. }) if mode & 0o2000 == 0),
            "sgid: {sgid:?}"
        );
    }
    let text = render::unified(&layers, &changes);
    for name in &specials {
        ensure!(
            text.contains(&format!("# {name}: ")),
            "the diff does not say {name} is refused:\n{text}"
        );
    }
    // All at once: refused, nothing applied (not even `ordinary`).
    match w.commit(&[], None)? {
        Err(CommitError::Refused { .. }) => {}
        other => fail!("a commit of everything was not refused: {other:?}"),
    }
    w.ws_unchanged(&before, "by a refused commit")?;
    // Each by name.
    for name in &specials {
        refused(w.commit(&[name], None)?, name)?;
    }
    w.ws_unchanged(&before, "by refused commits")?;
    // What is not refused goes through; the rest is discarded.
    w.commit(&["ordinary"], None)?.ctx("commit ordinary")?;
    ensure_eq!(
        std::fs::read(w.ws.join("ordinary")).ok(),
        Some(b"x\n".to_vec()),
        "ordinary after its commit"
    );
    w.discard(&specials)?;
    ensure!(
        w.changes()?.iter().all(|c| c.refusal().is_none()),
        "refused changes left after discarding them"
    );
    for name in ["dev", "fifo", "sock", "suid", "sgid"] {
        ensure!(
            std::fs::symlink_metadata(w.ws.join(name)).is_err(),
            "{name} reached the workspace"
        );
    }
    w.finish(None)
}

pub(crate) fn a_whiteout_or_opaque_dir_cannot_delete_anything_outside_the_workspace(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, |ws| {
        let out = ws.parent().map(|p| p.join("outside")).unwrap_or_default();
        std::os::unix::fs::symlink(&out, ws.join("link"))?;
        std::os::unix::fs::symlink("../outside", ws.join("link2"))?;
        std::os::unix::fs::symlink(&out, ws.join("link3"))?;
        std::os::unix::fs::symlink("../outside/sub", ws.join("link4"))?;
        std::fs::create_dir_all(ws.join("real/inner"))?;
        std::fs::write(ws.join("real/inner/f"), "f\n")?;
        std::os::unix::fs::symlink("real", ws.join("alias"))?;
        std::fs::write(ws.join("inside"), "x\n")?;
        std::fs::write(ws.join("replaced"), "r\n")
    })?;
    let before = w.snapshot_ws()?;
    let out = w.outside.display().to_string();
    let sb = w.open()?;
    // From inside: delete the symlinks and what they point to, a
    // directory that is a symlink's target, `..` games, and whiteouts
    // made by `mknod` (a 0/0 device anyone may make).
    let _ = run(
        sb.sb(),
        &format!(
            "rm link; rm -rf link2/ link2/* link3/* link4/deep; rm -r real; \
             rm -rf ../outside ../outside/* '{out}/secret' '{out}/sub'; \
             ln -s .. up; rm -rf up/outside up/outside/*; \
             mkdir -p dd && cd dd && rm -rf ../../outside; cd ..; \
             rm replaced; mknod replaced c 0 0; mknod ghost c 0 0; true"
        ),
    )?;
    sb.close()?;
    w.outside_unchanged()?;
    w.ws_unchanged(&before, "by deleting from inside")?;
    // A crafted layer: a whiteout beneath a workspace symlink to the
    // outside, an opaque directory over one, and one over a relative one.
    let up = w.state().upper();
    let craft = || -> io::Result<()> {
        for name in ["link2", "link3", "link4"] {
            // Whatever the commands left there (a whiteout of the
            // symlink, say) makes way for a directory.
            let path = up.join(name);
            match std::fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => continue,
                Ok(_) => std::fs::remove_file(&path)?,
                Err(_) => {}
            }
            std::fs::create_dir(&path)?;
        }
        whiteout(&up.join("link2/secret"))?;
        whiteout(&up.join("link4/deep"))?;
        rfs::setxattr(
            up.join("link3"),
            "user.overlay.opaque",
            b"y",
            rfs::XattrFlags::empty(),
        )?;
        Ok(())
    };
    craft().ctx("craft the upper layer")?;
    let sb = w.open()?;
    let seen = view(sb.sb())?;
    sb.close()?;
    let changes = w.changes()?;
    let hash = diff_hash(&changes);
    w.commit(&[], Some(&hash))?
        .ctx("commit the deletions and the crafted layer")?;
    w.outside_unchanged()?;
    same_view(
        &w.ws_view()?,
        &seen,
        "the workspace after the commit, against what the sandbox saw",
    )?;
    ensure!(
        std::fs::symlink_metadata(w.ws.join("link")).is_err()
            && std::fs::symlink_metadata(w.ws.join("real")).is_err()
            && std::fs::read_link(w.ws.join("alias")).is_ok()
            && w.ws.join("inside").is_file()
            && std::fs::symlink_metadata(w.ws.join("replaced")).is_err()
            && std::fs::symlink_metadata(w.ws.join("ghost")).is_err(),
        "the workspace is not what the deletions should make it: {:?}",
        w.ws_view()?
    );
    w.finish(None)
}

/// A whiteout (character device 0/0) at `path`, as overlayfs makes one
/// (unprivileged users may make this one device).
fn whiteout(path: &Path) -> io::Result<()> {
    rfs::mknodat(rfs::CWD, path, FileType::CharacterDevice, Mode::empty(), 0)?;
    Ok(())
}

pub(crate) fn a_file_swapped_for_a_symlink_between_diff_and_commit_is_refused_by_expect(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, |ws| std::fs::write(ws.join("f"), "old\n"))?;
    let before = w.snapshot_ws()?;
    let out = w.outside.display().to_string();
    let sb = w.open()?;
    ok(sb.sb(), "echo reviewed > f && echo reviewed > g")?;
    sb.close()?;
    // The review.
    let reviewed = w.changes()?;
    let hash = diff_hash(&reviewed);
    let text = render::unified(&w.layers()?, &reviewed);
    ensure!(text.contains("+reviewed"), "the reviewed diff: {text}");
    // The sandbox goes on and swaps the files for symlinks out.
    let sb = w.open()?;
    ok(
        sb.sb(),
        &format!("rm g f && ln -s '{out}/secret' g && ln -s '{out}/secret' f"),
    )?;
    sb.close()?;
    for paths in [&[][..], &["g"][..], &["f"][..]] {
        match w.commit(paths, Some(&hash))? {
            Err(CommitError::ExpectMismatch { expected, actual }) => {
                ensure!(expected == hash && actual != hash, "{expected} {actual}")
            }
            other => fail!("a commit of {paths:?} after the swap was not refused: {other:?}"),
        }
        w.ws_unchanged(&before, "by a commit --expect refused")?;
        w.outside_unchanged()?;
    }
    // Reviewed again, the symlinks are committed as symlinks.
    let now = w.changes()?;
    ensure_eq!(
        statuses(&now),
        vec![
            ("f".to_string(), Status::TypeChanged),
            ("g".into(), Status::Added)
        ],
        "the changes after the swap"
    );
    w.commit(&[], Some(&diff_hash(&now)))?
        .ctx("commit what was reviewed again")?;
    ensure_eq!(
        std::fs::read_link(w.ws.join("g")).ok(),
        Some(w.outside.join("secret")),
        "g after the commit"
    );
    w.finish(None)
}

pub(crate) fn the_upper_layer_and_state_directory_are_not_reachable_from_inside_but_through_the_view(
    make: &CowFactory,
) -> Res {
    let w = World::new(make, |ws| {
        std::fs::write(ws.join("a"), "a\n")?;
        std::fs::write(ws.join("hidden"), "hidden\n")
    })?;
    let mark = format!("{}", std::process::id());
    let state = w.state();
    // Markers only a way around the view can see: a file in the state
    // directory, a whiteout in the upper layer (the view shows nothing
    // there) and in a checkpoint's copy of it.
    let state_marker = state.dir().join(format!("hako-state-{mark}"));
    std::fs::write(&state_marker, "state\n").ctx("plant the state marker")?;
    let upper_marker = state.upper().join(format!("wh-{mark}"));
    std::fs::write(w.ws.join(format!("wh-{mark}")), "lower\n").ctx("plant the lower file")?;
    whiteout(&upper_marker).ctx("plant the upper marker")?;
    std::fs::write(state.upper().join("planted"), "in the layer\n").ctx("plant a layer file")?;
    let cp = state.checkpoint(Some("c")).ctx("checkpoint")?;
    let (_, cp_upper) = state
        .checkpoint_upper(&cp.id.to_string())
        .ctx("the checkpoint")?;
    let cp_marker = cp_upper.join(format!("wh-{mark}"));
    let base_before = std::fs::read(state.dir().join("base.json")).ctx("read base.json")?;
    let sb = w.open()?;
    // Through the view: the layer's file, and the whiteout hides.
    ensure_eq!(
        ok(
            sb.sb(),
            &format!("cat planted; test -e wh-{mark} || echo hidden")
        )?,
        "in the layer\nhidden\n",
        "the layered view"
    );
    // Every suffix of each marker's host path, looked for beneath `/`
    // and beneath every root, working directory and open descriptor
    // /proc shows inside: a way to any directory above a marker finds it.
    let mut suffixes = Vec::new();
    for marker in [&state_marker, &upper_marker, &cp_marker] {
        let parts: Vec<String> = marker
            .iter()
            .skip(1)
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        for i in 0..parts.len() {
            suffixes.push(format!("'{}'", parts[i..].join("/")));
        }
    }
    let script = format!(
        "for l in / /proc/[0-9]*/root /proc/[0-9]*/cwd /proc/[0-9]*/fd/* \
           /proc/[0-9]*/task/[0-9]*/root /proc/[0-9]*/task/[0-9]*/cwd /proc/[0-9]*/map_files/*; do \
           for s in {}; do \
             if [ -e \"$l/$s\" ] || [ -L \"$l/$s\" ]; then echo \"$l/$s\"; fi; \
           done; \
         done; true",
        suffixes.join(" ")
    );
    let found = ok(sb.sb(), &script)?;
    ensure!(
        found.is_empty(),
        "the state directory or upper layer is reachable from inside: {found}"
    );
    // Nor written: by its host path, nor by /proc.
    let upper = state.upper().display().to_string();
    let dir = state.dir().display().to_string();
    let _ = run(
        sb.sb(),
        &format!(
            "echo x > '{dir}/base.json'; mkdir -p '{upper}/evil-{mark}'; echo x > '{upper}/evil-{mark}'; \
             for l in /proc/[0-9]*/root /proc/[0-9]*/cwd; do echo x > \"$l/{dir}/base.json\"; \
             echo x > \"$l/{upper}/evil-{mark}\"; done 2>/dev/null; true"
        ),
    )?;
    // Nor by the file API, which is fenced to the view.
    let s: &dyn Sandbox = sb.sb();
    ensure!(
        s.read_file(&state_marker).is_err() && s.read_file(&upper_marker).is_err(),
        "the file API reaches the state directory"
    );
    sb.close()?;
    ensure_eq!(
        std::fs::read(state.dir().join("base.json")).ok(),
        Some(base_before),
        "base.json after the sandbox tried to write it"
    );
    ensure!(
        std::fs::symlink_metadata(state.upper().join(format!("evil-{mark}"))).is_err(),
        "the sandbox wrote into the upper layer by its host path"
    );
    w.finish(None)
}

pub(crate) fn a_rename_of_a_directory_of_10000_files_is_reviewed_and_committed(
    make: &CowFactory,
) -> Res {
    const N: usize = 10_000;
    // Every hundredth file has content (its number), the others are
    // empty and told apart by name and mode: removing a file with data
    // is slow on a file system mounted with `discard`, and the case
    // makes, copies, commits and removes each three times over.
    let w = World::new(make, |ws| {
        for d in 0..10 {
            std::fs::create_dir_all(ws.join(format!("old/d{d}")))?;
        }
        for i in 0..N {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(if i % 3 == 0 { 0o600 } else { 0o644 })
                .open(ws.join(format!("old/d{}/f{i}", i % 10)))?;
            if i % 100 == 0 {
                file.write_all(format!("{i}\n").as_bytes())?;
            }
        }
        Ok(())
    })?;
    let before = w.snapshot_ws()?;
    let sb = w.open()?;
    ok(sb.sb(), "mv old new")?;
    let seen = view(sb.sb())?;
    ensure_eq!(
        seen.len(),
        N + 11,
        "entries the sandbox sees after the rename"
    );
    sb.close()?;
    w.ws_unchanged(&before, "by the rename")?;
    // The review: every file deleted from `old` and added in `new`.
    let changes = w.changes()?;
    let count = |s: Status| changes.iter().filter(|c| c.status() == s).count();
    ensure_eq!(
        (count(Status::Deleted), count(Status::Added), changes.len()),
        (N + 11, N + 11, 2 * (N + 11)),
        "deleted, added and all changes"
    );
    let hash = diff_hash(&changes);
    let report = w.commit(&[], Some(&hash))?.ctx("commit the rename")?;
    ensure_eq!(report.applied.len(), changes.len(), "changes applied");
    same_view(
        &w.ws_view()?,
        &seen,
        "the workspace after the commit, against what the sandbox saw",
    )?;
    ensure!(w.changes()?.is_empty(), "changes left after the commit");
    w.finish(None)
}
