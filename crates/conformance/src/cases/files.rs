//! Every file operation, on ordinary paths.

use std::ffi::OsString;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hako_core::{Command, DirListing, ExitStatus, FileKind};

use crate::check::{bytes_eq, expect_fence, expect_output, inside_abs, run, sh, Ctx, Fk, Res};
use crate::harness::diff;
use crate::Harness;

fn names(listing: &DirListing) -> Vec<String> {
    listing
        .entries
        .iter()
        .map(|e| e.name.to_string_lossy().into_owned())
        .collect()
}

fn host_names(dir: &Path) -> Res<Vec<String>> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ctx(format!("read_dir {dir:?}"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    Ok(names)
}

fn host_mode(h: &Harness, rel: &str) -> Res<u32> {
    Ok(h.host_path(rel)
        .symlink_metadata()
        .ctx(format!("lstat {rel}"))?
        .permissions()
        .mode()
        & 0o7777)
}

fn chmod(h: &Harness, rel: &str, mode: u32) -> Res {
    std::fs::set_permissions(h.host_path(rel), std::fs::Permissions::from_mode(mode))
        .ctx(format!("chmod {rel}"))
}

case! {
    /// What is written is read back byte for byte (all 256 byte values, NULs,
    /// an empty file), the same bytes are on disk and seen by a command, and
    /// what a command writes is read back.
    fn write_then_read_round_trips_binary_data(h) {
        let sb = h.sandbox();
        let mut data: Vec<u8> = (0..=255u8).collect();
        data.extend_from_slice(b"\0\0middle\0\r\nend");
        sb.write_file(Path::new("bin"), &data).ctx("write bin")?;
        bytes_eq(&sb.read_file(Path::new("bin")).ctx("read bin")?, &data, "read back")?;
        bytes_eq(&std::fs::read(h.host_path("bin")).ctx("host read")?, &data, "on disk")?;
        let out = run(h, &Command::new(["cat", "bin"]))?;
        expect_output(&out, &data, "cat bin inside")?;

        sb.write_file(Path::new("empty"), b"").ctx("write empty")?;
        bytes_eq(&sb.read_file(Path::new("empty")).ctx("read empty")?, b"", "empty file")?;

        h.plant_dir("sub/deep")?;
        sb.write_file(Path::new("sub/deep/f"), b"nested").ctx("write sub/deep/f")?;
        bytes_eq(&std::fs::read(h.host_path("sub/deep/f")).ctx("host read")?, b"nested", "nested file")?;

        let out = sh(h, "printf 'from-inside\\000x' > made-inside")?;
        expect_output(&out, b"", "a command writing a file")?;
        bytes_eq(
            &sb.read_file(Path::new("made-inside")).ctx("read made-inside")?,
            b"from-inside\0x",
            "a file a command wrote",
        )
    }
}

case! {
    /// Overwriting leaves exactly the one name behind (no temporary files),
    /// and a reader racing a writer sees the old or the new contents, never
    /// a mix or a short file.
    fn overwrite_is_atomic_and_leaves_no_temp_files(h) {
        let sb = h.sandbox();
        for content in [&b"first"[..], b"second, longer than the first", b"3"] {
            sb.write_file(Path::new("f"), content).ctx("write f")?;
            bytes_eq(&sb.read_file(Path::new("f")).ctx("read f")?, content, "f after overwrite")?;
        }
        ensure_eq!(names(&sb.list_dir(Path::new(".")).ctx("list .")?), ["f"], "list_dir after overwrites");
        ensure_eq!(host_names(h.workspace())?, ["f"], "the workspace on disk after overwrites");

        let a = vec![b'A'; 256 << 10];
        let b = vec![b'B'; 256 << 10];
        sb.write_file(Path::new("atomic"), &a).ctx("write atomic")?;
        let result: Res = std::thread::scope(|scope| {
            let writer = scope.spawn(|| -> Res {
                for i in 0..200 {
                    let data = if i % 2 == 0 { &b } else { &a };
                    sb.write_file(Path::new("atomic"), data).ctx("rewrite atomic")?;
                }
                Ok(())
            });
            let mut reads = 0;
            while !writer.is_finished() || reads < 50 {
                let got = sb.read_file(Path::new("atomic")).ctx("read atomic")?;
                ensure!(
                    got == a || got == b,
                    "a reader saw a mix or a short file: {} bytes, first {:?}, last {:?}",
                    got.len(),
                    got.first().map(|&c| c as char),
                    got.last().map(|&c| c as char)
                );
                reads += 1;
                if reads > 100_000 {
                    break;
                }
            }
            writer
                .join()
                .unwrap_or_else(|_| Err(crate::Outcome::Failed("the writer panicked".into())))
        });
        result?;
        ensure_eq!(host_names(h.workspace())?, ["atomic", "f"], "the workspace after racing writes");
        Ok(())
    }
}

case! {
    /// Replacing a file keeps its permission bits (0755 stays executable,
    /// 0600 stays private).
    fn write_preserves_the_mode_of_an_existing_file(h) {
        let sb = h.sandbox();
        for (name, mode) in [("script.sh", 0o755), ("private", 0o600), ("odd", 0o741)] {
            h.plant_file(name, b"old")?;
            chmod(h, name, mode)?;
            sb.write_file(Path::new(name), b"#!/bin/sh\necho new\n").ctx(format!("write {name}"))?;
            ensure_eq!(host_mode(h, name)?, mode, "mode of {name} after write_file");
            if let Some(stat) = sb.stat() {
                ensure_eq!(stat.stat(Path::new(name)).ctx("stat")?.mode, mode, "stat mode of {name}");
            }
        }
        let out = run(h, &Command::new(["./script.sh"]))?;
        expect_output(&out, b"new\n", "the rewritten script still runs")
    }
}

case! {
    /// `read_file_limit` reads at most the limit and says truncated exactly
    /// when the file has more: size, size-1, size+1, 0, and an empty file.
    fn read_file_limit_reports_truncation_exactly(h) {
        let Some(limited) = h.sandbox().read_limit() else {
            skip!("the backend does not offer read_file_limit");
        };
        h.plant_file("ten", b"0123456789")?;
        h.plant_file("empty", b"")?;
        for (path, max, data, truncated) in [
            ("ten", 10, &b"0123456789"[..], false),
            ("ten", 9, &b"012345678"[..], true),
            ("ten", 11, &b"0123456789"[..], false),
            ("ten", 1, &b"0"[..], true),
            ("ten", 0, &b""[..], true),
            ("ten", u64::MAX, &b"0123456789"[..], false),
            ("empty", 0, &b""[..], false),
            ("empty", 5, &b""[..], false),
        ] {
            let got = limited
                .read_file_limit(Path::new(path), max)
                .ctx(format!("read_file_limit {path} {max}"))?;
            bytes_eq(&got.data, data, format!("{path} limited to {max}"))?;
            ensure_eq!(got.truncated, truncated, "truncated for {path} limited to {max}");
        }
        Ok(())
    }
}

case! {
    /// Append creates a missing file and then appends, byte for byte.
    fn append_creates_then_appends(h) {
        let Some(append) = h.sandbox().append() else {
            skip!("the backend does not offer append");
        };
        append.append_file(Path::new("log"), b"a").ctx("append to a missing file")?;
        bytes_eq(&std::fs::read(h.host_path("log")).ctx("host read")?, b"a", "created by append")?;
        append.append_file(Path::new("log"), b"b\0c").ctx("append")?;
        append.append_file(Path::new("log"), b"").ctx("append nothing")?;
        bytes_eq(&std::fs::read(h.host_path("log")).ctx("host read")?, b"ab\0c", "after appends")?;
        bytes_eq(&h.sandbox().read_file(Path::new("log")).ctx("read")?, b"ab\0c", "read after appends")?;
        expect_fence(
            append.append_file(Path::new("nodir/log"), b"x"),
            &[Fk::NotFound],
            "append into a missing directory",
        )?;
        ensure_eq!(host_names(h.workspace())?, ["log"], "the workspace after appends");
        Ok(())
    }
}

case! {
    /// `make_dir_all` makes every missing parent, is idempotent, and refuses
    /// to turn a file into a directory.
    fn make_dir_all_creates_missing_parents(h) {
        let Some(mkdir) = h.sandbox().make_dir_all() else {
            skip!("the backend does not offer make_dir_all");
        };
        mkdir.make_dir_all(Path::new("a/b/c")).ctx("make_dir_all a/b/c")?;
        for dir in ["a", "a/b", "a/b/c"] {
            ensure!(h.host_path(dir).is_dir(), "{dir} is not a directory");
        }
        mkdir.make_dir_all(Path::new("a/b/c")).ctx("make_dir_all again")?;
        mkdir.make_dir_all(Path::new("a")).ctx("make_dir_all of an existing parent")?;
        mkdir.make_dir_all(Path::new("a/b/c/d/")).ctx("make_dir_all with a trailing slash")?;
        ensure!(h.host_path("a/b/c/d").is_dir(), "a/b/c/d is not a directory");
        h.plant_file("file", b"data")?;
        expect_fence(mkdir.make_dir_all(Path::new("file")), &[Fk::AlreadyExists], "make_dir_all over a file")?;
        expect_fence(
            mkdir.make_dir_all(Path::new("file/sub")),
            &[Fk::AlreadyExists, Fk::NotADirectory],
            "make_dir_all under a file",
        )?;
        bytes_eq(&std::fs::read(h.host_path("file")).ctx("host read")?, b"data", "the file")?;
        let out = run(h, &Command::new(["ls", "-d", "a/b/c/d"]))?;
        expect_output(&out, b"a/b/c/d\n", "the new directory seen inside")
    }
}

case! {
    /// `remove` deletes a file, an empty directory, and a symlink (not its
    /// target); a non-empty directory is refused with everything kept.
    fn remove_deletes_files_empty_dirs_and_links_but_never_recurses(h) {
        let sb = h.sandbox();
        h.plant_file("f", b"target")?;
        h.plant_dir("emptydir")?;
        h.plant_file("full/child", b"child")?;
        h.plant_symlink("link", "f")?;
        h.plant_symlink("dirlink", "full")?;
        sb.remove(Path::new("link")).ctx("remove link")?;
        sb.remove(Path::new("dirlink")).ctx("remove dirlink")?;
        ensure_eq!(host_names(h.workspace())?, ["emptydir", "f", "full"], "after removing links");
        bytes_eq(&std::fs::read(h.host_path("f")).ctx("read f")?, b"target", "the link's target")?;
        bytes_eq(&std::fs::read(h.host_path("full/child")).ctx("read child")?, b"child", "the dir link's target")?;
        expect_fence(sb.remove(Path::new("full")), &[Fk::DirectoryNotEmpty], "remove a non-empty directory")?;
        ensure_eq!(host_names(&h.host_path("full"))?, ["child"], "the non-empty directory");
        sb.remove(Path::new("f")).ctx("remove f")?;
        sb.remove(Path::new("emptydir")).ctx("remove emptydir")?;
        ensure_eq!(host_names(h.workspace())?, ["full"], "after removing f and emptydir");
        expect_fence(sb.remove(Path::new("missing")), &[Fk::NotFound], "remove a missing file")?;
        for path in [".", "", "full/.."] {
            expect_fence(sb.remove(Path::new(path)), &[Fk::NoFileName], format!("remove {path:?}"))?;
        }
        ensure_eq!(host_names(h.workspace())?, ["full"], "after refused removals");
        Ok(())
    }
}

case! {
    /// `list_dir` is sorted by name and built from `lstat`: symlinks (also
    /// dangling ones) are symlinks, sizes and kinds are exact.
    fn list_dir_is_sorted_and_reports_symlinks_as_symlinks(h) {
        let sb = h.sandbox();
        h.plant_file("b", b"bbb")?;
        h.plant_file("a", b"a")?;
        h.plant_file("C", b"CC")?;
        h.plant_file(".hidden", b"")?;
        h.plant_dir("dir")?;
        h.plant_symlink("link", "a")?;
        h.plant_symlink("zdangling", "nowhere")?;
        h.plant_symlink("dirlink", "dir")?;
        h.plant_fifo("pipe")?;
        let expected: [(&str, FileKind, Option<u64>); 9] = [
            (".hidden", FileKind::File, Some(0)),
            ("C", FileKind::File, Some(2)),
            ("a", FileKind::File, Some(1)),
            ("b", FileKind::File, Some(3)),
            ("dir", FileKind::Dir, None),
            ("dirlink", FileKind::Symlink, Some(3)),
            ("link", FileKind::Symlink, Some(1)),
            ("pipe", FileKind::Fifo, Some(0)),
            ("zdangling", FileKind::Symlink, Some(7)),
        ];
        for root in ["", ".", "./"] {
            let listing = sb.list_dir(Path::new(root)).ctx(format!("list {root:?}"))?;
            ensure!(!listing.truncated, "a 9-entry listing is truncated");
            let got: Vec<(String, FileKind, Option<u64>)> = listing
                .entries
                .iter()
                .zip(&expected)
                .map(|(e, (_, _, size))| (e.name.to_string_lossy().into_owned(), e.kind, size.map(|_| e.size)))
                .collect();
            let want: Vec<(String, FileKind, Option<u64>)> =
                expected.iter().map(|(n, k, s)| (n.to_string(), *k, *s)).collect();
            ensure_eq!(listing.entries.len(), expected.len(), "entries of {root:?}");
            ensure_eq!(got, want, "listing of {root:?} (name, kind, size)");
        }
        let a = std::fs::symlink_metadata(h.host_path("a")).ctx("lstat a")?;
        let listing = sb.list_dir(Path::new(".")).ctx("list")?;
        let entry = listing.entries.iter().find(|e| e.name.as_os_str() == "a").ctx("entry a")?;
        ensure_eq!((entry.mode, entry.mtime), (a.permissions().mode() & 0o7777, a.mtime()), "mode and mtime of a");
        ensure_eq!(names(&sb.list_dir(Path::new("dir")).ctx("list dir")?), Vec::<String>::new(), "an empty directory");
        ensure_eq!(names(&sb.list_dir(Path::new("dirlink")).ctx("list dirlink")?), Vec::<String>::new(), "through a symlink");
        Ok(())
    }
}

case! {
    /// `stat` is `lstat`: a symlink is reported as a symlink with its target
    /// as stored, and files and directories exactly.
    fn stat_reports_symlinks_without_following_them(h) {
        let Some(stat) = h.sandbox().stat() else {
            skip!("the backend does not offer stat");
        };
        h.plant_file("f", b"hello")?;
        chmod(h, "f", 0o640)?;
        h.plant_dir("d")?;
        h.plant_symlink("l", "f")?;
        h.plant_symlink("dangling", "missing/target")?;
        let f = stat.stat(Path::new("f")).ctx("stat f")?;
        let host = std::fs::symlink_metadata(h.host_path("f")).ctx("lstat f")?;
        ensure_eq!(
            (f.kind, f.size, f.mode, f.links, f.mtime, f.symlink_target.clone()),
            (FileKind::File, 5, 0o640, 1, host.mtime(), None),
            "stat f (kind, size, mode, links, mtime, target)"
        );
        let l = stat.stat(Path::new("l")).ctx("stat l")?;
        ensure_eq!((l.kind, l.size, l.symlink_target.clone()), (FileKind::Symlink, 1, Some(OsString::from("f"))), "stat l");
        let d = stat.stat(Path::new("dangling")).ctx("stat dangling")?;
        ensure_eq!(
            (d.kind, d.symlink_target.clone()),
            (FileKind::Symlink, Some(OsString::from("missing/target"))),
            "stat of a dangling symlink"
        );
        for dir in ["d", ".", ""] {
            ensure_eq!(stat.stat(Path::new(dir)).ctx(format!("stat {dir:?}"))?.kind, FileKind::Dir, "stat {dir:?}");
        }
        expect_fence(stat.stat(Path::new("missing")), &[Fk::NotFound], "stat missing")?;
        Ok(())
    }
}

case! {
    /// Ordinary failures come back as the right variant: a directory where a
    /// file is wanted, a missing path, a file where a directory is wanted,
    /// no file name; and they change nothing.
    fn file_errors_name_the_condition(h) {
        let sb = h.sandbox();
        h.plant_dir("adir")?;
        h.plant_file("file", b"data")?;
        let before = h.snapshot_workspace().ctx("snapshot")?;
        let p = Path::new;
        expect_fence(sb.read_file(p("adir")), &[Fk::IsADirectory], "read a directory")?;
        expect_fence(sb.read_file(p("missing")), &[Fk::NotFound], "read a missing file")?;
        expect_fence(sb.read_file(p("nodir/f")), &[Fk::NotFound], "read under a missing directory")?;
        expect_fence(sb.read_file(p("file/x")), &[Fk::NotADirectory], "read under a file")?;
        if let Some(limited) = sb.read_limit() {
            expect_fence(limited.read_file_limit(p("adir"), 10), &[Fk::IsADirectory], "read_file_limit a directory")?;
            expect_fence(limited.read_file_limit(p("missing"), 10), &[Fk::NotFound], "read_file_limit missing")?;
        }
        expect_fence(sb.write_file(p("adir"), b"x"), &[Fk::IsADirectory], "write over a directory")?;
        expect_fence(sb.write_file(p("nodir/f"), b"x"), &[Fk::NotFound], "write into a missing directory")?;
        for path in [".", "", "adir/.."] {
            expect_fence(sb.write_file(p(path), b"x"), &[Fk::NoFileName], format!("write {path:?}"))?;
        }
        if let Some(append) = sb.append() {
            expect_fence(append.append_file(p("adir"), b"x"), &[Fk::IsADirectory], "append to a directory")?;
        }
        expect_fence(sb.list_dir(p("file")), &[Fk::NotADirectory], "list a file")?;
        expect_fence(sb.list_dir(p("missing")), &[Fk::NotFound], "list a missing directory")?;
        expect_fence(sb.exec(&Command::new(["true"]).cwd("missing")), &[Fk::NotFound], "cwd missing")?;
        expect_fence(sb.exec(&Command::new(["true"]).cwd("file")), &[Fk::NotADirectory], "cwd a file")?;
        let after = h.snapshot_workspace().ctx("snapshot")?;
        if let Some(d) = diff(&before, &after) {
            fail!("failed operations changed the workspace: {d}");
        }
        Ok(())
    }
}

case! {
    /// An absolute path under the sandbox's workdir works like the relative
    /// one, for every operation.
    fn absolute_paths_inside_the_workspace_are_accepted(h) {
        let Some(wd) = h.sandbox().workdir().map(|w| w.workdir().to_path_buf()) else {
            skip!("the backend does not report a workdir");
        };
        ensure!(wd.is_absolute(), "workdir {wd:?} is not absolute");
        let sb = h.sandbox();
        h.plant_dir("sub")?;
        let abs = |rel: &str| -> PathBuf { wd.join(rel) };
        sb.write_file(&abs("abs.txt"), b"absolute").ctx("write abs")?;
        bytes_eq(&std::fs::read(h.host_path("abs.txt")).ctx("host read")?, b"absolute", "written by absolute path")?;
        bytes_eq(&sb.read_file(&abs("abs.txt")).ctx("read abs")?, b"absolute", "read by absolute path")?;
        if let Some(append) = sb.append() {
            append.append_file(&abs("abs.txt"), b"+").ctx("append abs")?;
        }
        if let Some(limited) = sb.read_limit() {
            let got = limited.read_file_limit(&abs("abs.txt"), 3).ctx("read_file_limit abs")?;
            bytes_eq(&got.data, b"abs", "read_file_limit by absolute path")?;
        }
        if let Some(stat) = sb.stat() {
            ensure_eq!(stat.stat(&abs("abs.txt")).ctx("stat abs")?.kind, FileKind::File, "stat abs");
            ensure_eq!(stat.stat(&wd).ctx("stat the workdir")?.kind, FileKind::Dir, "stat the workdir");
        }
        ensure_eq!(names(&sb.list_dir(&wd).ctx("list the workdir")?), ["abs.txt", "sub"], "list the workdir");
        if let Some(mkdir) = sb.make_dir_all() {
            mkdir.make_dir_all(&abs("new/dir")).ctx("make_dir_all abs")?;
            ensure!(h.host_path("new/dir").is_dir(), "new/dir was not made");
        }
        let out = run(h, &Command::new(["pwd", "-P"]).cwd(abs("sub")))?;
        expect_output(&out, format!("{}\n", abs("sub").display()).as_bytes(), "cwd by absolute path")?;
        sb.remove(&abs("abs.txt")).ctx("remove abs")?;
        ensure!(!h.host_path("abs.txt").exists(), "abs.txt was not removed");
        Ok(())
    }
}

case! {
    /// Symlinks whose targets stay inside are followed, by every operation:
    /// to a file, to a directory, chained, and climbing with `..` inside.
    fn symlinks_that_stay_inside_the_workspace_are_followed(h) {
        let sb = h.sandbox();
        h.plant_file("real/f", b"REAL")?;
        h.plant_symlink("lf", "real/f")?;
        h.plant_symlink("ld", "real")?;
        h.plant_symlink("chain", "lf")?;
        h.plant_symlink("real/up", "../real/f")?;
        for path in ["lf", "ld/f", "chain", "real/up", "ld/up", "ld/../real/f"] {
            bytes_eq(&sb.read_file(Path::new(path)).ctx(format!("read {path}"))?, b"REAL", format!("read {path}"))?;
        }
        ensure_eq!(names(&sb.list_dir(Path::new("ld")).ctx("list ld")?), ["f", "up"], "list through a symlink");
        sb.write_file(Path::new("ld/new"), b"N").ctx("write ld/new")?;
        bytes_eq(&std::fs::read(h.host_path("real/new")).ctx("host read")?, b"N", "written through a dir symlink")?;
        sb.write_file(Path::new("lf"), b"NEW").ctx("write lf")?;
        bytes_eq(&std::fs::read(h.host_path("real/f")).ctx("host read")?, b"NEW", "written through a file symlink")?;
        ensure_eq!(crate::check::host_kind(&h.host_path("lf")), Some(FileKind::Symlink), "lf after a write through it");
        if let Some(append) = sb.append() {
            append.append_file(Path::new("chain"), b"+").ctx("append chain")?;
            bytes_eq(&std::fs::read(h.host_path("real/f")).ctx("host read")?, b"NEW+", "appended through a chain")?;
        }
        if let Some(stat) = sb.stat() {
            ensure_eq!(stat.stat(Path::new("ld/f")).ctx("stat ld/f")?.kind, FileKind::File, "stat through a dir symlink");
        }
        if let Some(mkdir) = sb.make_dir_all() {
            mkdir.make_dir_all(Path::new("ld/made")).ctx("make_dir_all ld/made")?;
            ensure!(h.host_path("real/made").is_dir(), "real/made was not made");
        }
        if let Some(expected) = inside_abs(h, "real") {
            let out = run(h, &Command::new(["pwd", "-P"]).cwd("ld"))?;
            expect_output(&out, format!("{}\n", expected.display()).as_bytes(), "cwd through a symlink")?;
        }
        Ok(())
    }
}

case! {
    /// A 255-byte name and a 4095-byte path work; the same path plus one byte
    /// is refused as too long.
    fn paths_at_the_length_limits_work(h) {
        let sb = h.sandbox();
        let name = "n".repeat(255);
        sb.write_file(Path::new(&name), b"long name").ctx("write a 255-byte name")?;
        bytes_eq(&sb.read_file(Path::new(&name)).ctx("read")?, b"long name", "a 255-byte name")?;
        ensure_eq!(names(&sb.list_dir(Path::new(".")).ctx("list")?), [name.as_str()], "list");
        let Some(mkdir) = sb.make_dir_all() else {
            skip!("the backend does not offer make_dir_all, needed to build a 4095-byte path");
        };
        let component = "x".repeat(255);
        let dirs = vec![component.as_str(); 15].join("/");
        let path = format!("{dirs}/{component}");
        ensure_eq!(path.len(), 4095, "the constructed path length");
        mkdir.make_dir_all(Path::new(&dirs)).ctx("make_dir_all of a 3839-byte path")?;
        sb.write_file(Path::new(&path), b"deep").ctx("write a 4095-byte path")?;
        bytes_eq(&sb.read_file(Path::new(&path)).ctx("read a 4095-byte path")?, b"deep", "a 4095-byte path")?;
        let longer = format!("{path}/");
        expect_fence(sb.read_file(Path::new(&longer)), &[Fk::TooLongPath], "a 4096-byte path")?;
        let out = run(h, &Command::new(["cat", path.as_str()]))?;
        ensure_eq!(out.status, ExitStatus::Code(0), "cat of the deep file inside");
        bytes_eq(&out.stdout, b"deep", "the deep file inside")
    }
}
