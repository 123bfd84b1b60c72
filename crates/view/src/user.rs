//! Who a sandbox's commands are: a user of the sandbox's own, named
//! [`NAME`], in an `/etc/passwd` and an `/etc/group` of its own bound over
//! the host's, with its home at [`home`]. `whoami`, `id -un`, `$HOME`,
//! `echo ~` and `cd ~` then agree, and no name of the host's users shows
//! inside (only one uid is mapped into the sandbox: every other owner is
//! the overflow uid, `nobody`).

use std::path::{Component, Path, PathBuf};

use crate::SYSTEM_DIRS;

/// The sandbox user's name, and its group's.
pub const NAME: &str = "hako";

/// The home of a sandbox whose user's home cannot be used (see [`home`]).
pub const FALLBACK_HOME: &str = "/home/hako";

/// The overflow id the kernel shows for every unmapped owner.
const NOBODY: u32 = 65534;

/// The sandbox's home directory: `asked` (the host user's home path, or a
/// `HOME` set for the sandbox) when it is a plain absolute path that can
/// hold a directory of the sandbox's own; else [`FALLBACK_HOME`]. Refused,
/// and so replaced: a relative path, `/`, `.` or `..` components, a path
/// under a system directory the view binds (`/usr`, `/etc`, ...) or under
/// `/proc` or `/dev`, and a path that is not UTF-8 or holds a `:` or a
/// control character (it could not be written in `/etc/passwd`).
pub fn home(asked: Option<&Path>) -> PathBuf {
    let usable = |path: &Path| {
        let text = path.to_str()?;
        let plain = path.is_absolute()
            && path.components().count() > 1
            && path
                .components()
                .skip(1)
                .all(|c| matches!(c, Component::Normal(_)))
            && !text.chars().any(|c| c == ':' || c.is_control())
            && !SYSTEM_DIRS
                .iter()
                .chain(&["/proc", "/dev"])
                .any(|dir| path.starts_with(dir));
        // `Path` drops `.` components: written as it reads.
        plain.then(|| path.components().collect())
    };
    asked
        .and_then(usable)
        .unwrap_or_else(|| PathBuf::from(FALLBACK_HOME))
}

/// The sandbox's `/etc/passwd`: root, the sandbox user (`uid`, `gid`,
/// `home`, `/bin/sh`), and `nobody` (the owner of every file whose owner is
/// not mapped into the sandbox). `home` comes from [`home`].
pub fn passwd(uid: u32, gid: u32, home: &Path) -> String {
    let mut lines = String::from("root:x:0:0:root:/root:/bin/sh\n");
    lines.push_str(&format!(
        "{NAME}:x:{uid}:{gid}:{NAME}:{}:/bin/sh\n",
        home.display()
    ));
    if uid != NOBODY {
        lines.push_str(&format!(
            "nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
        ));
    }
    lines
}

/// The sandbox's `/etc/group`: root, the sandbox user's group, `nogroup`.
pub fn group(gid: u32) -> String {
    let mut lines = String::from("root:x:0:\n");
    lines.push_str(&format!("{NAME}:x:{gid}:\n"));
    if gid != NOBODY {
        lines.push_str(&format!("nogroup:x:{NOBODY}:\n"));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_users_own_home_path_is_kept() {
        for asked in ["/root", "/home/alice", "/tmp/h", "/srv/agent home"] {
            assert_eq!(home(Some(Path::new(asked))), Path::new(asked));
        }
    }

    #[test]
    fn a_home_that_cannot_be_the_sandboxes_falls_back() {
        for asked in [
            "",
            "relative",
            "/",
            "/usr/local/me",
            "/etc",
            "/proc/self",
            "/dev/shm",
            "/home/../etc",
            "/home/a:b",
            "/home/a\nroot::0:0::/:/bin/sh",
        ] {
            assert_eq!(
                home(Some(Path::new(asked))),
                Path::new(FALLBACK_HOME),
                "{asked:?}"
            );
        }
        assert_eq!(home(None), Path::new(FALLBACK_HOME));
        assert_eq!(home(Some(Path::new("/home/./a/"))), Path::new("/home/a"));
    }

    #[test]
    fn passwd_and_group_name_the_sandbox_user_once() {
        let passwd = passwd(1000, 1000, Path::new("/root"));
        assert_eq!(
            passwd
                .lines()
                .filter(|l| l.starts_with("hako:"))
                .collect::<Vec<_>>(),
            ["hako:x:1000:1000:hako:/root:/bin/sh"]
        );
        assert!(
            passwd.lines().all(|l| l.split(':').count() == 7),
            "{passwd}"
        );
        assert_eq!(
            group(1000)
                .lines()
                .filter(|l| l.starts_with("hako:"))
                .count(),
            1
        );
        // Run as nobody, no second line has its id.
        assert_eq!(
            super::passwd(NOBODY, NOBODY, Path::new("/h"))
                .lines()
                .count(),
            2
        );
        assert_eq!(group(NOBODY).lines().count(), 2);
    }
}
