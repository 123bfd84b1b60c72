//! The working directory of a command: fenced like every other path.

use std::path::{Path, PathBuf};

use hako_core::Command;

use crate::check::{expect_output, refused, run, Fk, Op};

case! {
    /// A command starts in the workspace root, or in the directory `cwd`
    /// names (relative, absolute inside, through an inside symlink, with a
    /// `..` that stays inside); `pwd -P` says exactly where.
    fn cwd_runs_the_command_in_that_directory(h) {
        h.plant_dir("sub/deeper")?;
        h.plant_symlink("linkdir", "sub")?;
        let wd = h.sandbox().workdir().map(|w| w.workdir().to_path_buf());
        let expect = |rel: &str| -> Vec<u8> {
            match &wd {
                Some(wd) if rel.is_empty() => format!("{}\n", wd.display()).into_bytes(),
                Some(wd) => format!("{}\n", wd.join(rel).display()).into_bytes(),
                None => Vec::new(),
            }
        };
        let mut cases: Vec<(Option<PathBuf>, &str)> = vec![
            (None, ""),
            (Some(PathBuf::from(".")), ""),
            (Some(PathBuf::from("")), ""),
            (Some(PathBuf::from("sub")), "sub"),
            (Some(PathBuf::from("sub/deeper")), "sub/deeper"),
            (Some(PathBuf::from("sub/deeper/..")), "sub"),
            (Some(PathBuf::from("./sub/")), "sub"),
            (Some(PathBuf::from("linkdir")), "sub"),
        ];
        if let Some(wd) = &wd {
            cases.push((Some(wd.join("sub")), "sub"));
            cases.push((Some(wd.clone()), ""));
        }
        for (cwd, rel) in cases {
            let mut command = Command::new(["pwd", "-P"]);
            if let Some(cwd) = &cwd {
                command = command.cwd(cwd);
            }
            let out = run(h, &command)?;
            if wd.is_some() {
                expect_output(&out, &expect(rel), format!("pwd -P in {cwd:?}"))?;
            } else {
                let got = String::from_utf8_lossy(&out.stdout);
                ensure!(got.trim_end().ends_with(&format!("/{rel}")), "pwd -P in {cwd:?}: {got:?}");
            }
        }
        let out = run(h, &Command::shell("echo made > made").cwd("sub/deeper"))?;
        expect_output(&out, b"", "writing a relative file")?;
        ensure!(h.host_path("sub/deeper/made").is_file(), "a relative file did not land in the cwd");
        Ok(())
    }
}

case! {
    /// A cwd outside the workspace (`..`, absolute, a symlink to outside, a
    /// NUL byte) is refused with the exact fence error, and the command does
    /// not run.
    fn cwd_outside_the_workspace_is_refused_and_nothing_runs(h) {
        h.plant_dir("sub")?;
        h.plant_symlink("out_abs", h.outside())?;
        h.plant_symlink("out_rel", "../outside")?;
        h.plant_symlink("sub/up", "../../outside")?;
        let cwd = [Op::Cwd];
        for path in ["..", "../outside", "sub/../..", "../ws"] {
            refused(h, Path::new(path), &cwd, &[Fk::DotDotEscape])?;
        }
        for path in [Path::new("/etc"), Path::new("/"), h.outside(), h.root()] {
            refused(h, path, &cwd, &[Fk::AbsoluteOutside])?;
        }
        for path in ["out_abs", "out_rel", "sub/up", "out_abs/dir", "sub/up/dir"] {
            refused(h, Path::new(path), &cwd, &[Fk::SymlinkEscape])?;
        }
        refused(h, Path::new("sub\0"), &cwd, &[Fk::NulByte])?;
        Ok(())
    }
}
