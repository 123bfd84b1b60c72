//! Lexical checks every fence applies before it asks the kernel anything.
//!
//! These checks give clear errors for the obvious attacks; they are not the
//! boundary. The boundary is the kernel resolving the checked path beneath a
//! root directory descriptor (see the `hako-fence` crate), which also catches
//! what no lexical check can see: symlinks, and renames racing the operation.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::error::FenceError;

/// Longest path the kernel accepts, in bytes, without the final NUL.
pub const PATH_MAX: usize = 4095;
/// Longest path component, in bytes.
pub const NAME_MAX: usize = 255;

/// The path as shown in an error message: at most 200 bytes, then `...`.
/// A hostile path can be as long as the kernel allows; messages stay short.
pub fn shown(path: &Path) -> PathBuf {
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() <= 200 {
        return path.to_path_buf();
    }
    let mut short = bytes[..200].to_vec();
    short.extend_from_slice(b"...");
    PathBuf::from(OsStr::from_bytes(&short))
}

/// Checks a caller's path and turns it into a path relative to the root.
///
/// `workdir` is the absolute path of the root as the caller sees it: an
/// absolute path under it is accepted and made relative; any other absolute
/// path is refused. The result never starts with `/`, never climbs above the
/// root lexically, and is `.` for the root itself.
pub fn relative(path: &Path, workdir: &Path) -> Result<PathBuf, FenceError> {
    let bytes = path.as_os_str().as_bytes();
    if bytes.contains(&0) {
        let escaped = String::from_utf8_lossy(bytes).replace('\0', "\\0");
        return Err(FenceError::NulByte {
            path: shown(Path::new(&escaped)),
        });
    }
    if bytes.len() > PATH_MAX {
        return Err(FenceError::TooLong {
            path: shown(path),
            what: "path",
            len: bytes.len(),
            max: PATH_MAX,
        });
    }
    let rel: &Path = if path.is_absolute() {
        match path.strip_prefix(workdir) {
            Ok(rest) if workdir.is_absolute() => rest,
            _ => {
                return Err(FenceError::AbsoluteOutside {
                    path: path.to_path_buf(),
                })
            }
        }
    } else {
        path
    };
    let mut depth: usize = 0;
    let mut out = PathBuf::new();
    for component in rel.components() {
        match component {
            Component::Normal(name) => {
                if name.len() > NAME_MAX {
                    return Err(FenceError::TooLong {
                        path: shown(path),
                        what: "component",
                        len: name.len(),
                        max: NAME_MAX,
                    });
                }
                depth += 1;
                out.push(name);
            }
            Component::ParentDir => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| FenceError::DotDotEscape {
                        path: path.to_path_buf(),
                    })?;
                out.push("..");
            }
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(FenceError::AbsoluteOutside {
                    path: path.to_path_buf(),
                })
            }
        }
    }
    if out.as_os_str().is_empty() {
        out.push(".");
    }
    Ok(out)
}

/// Splits a checked relative path into its parent and its final name, for
/// operations that create, replace or remove a directory entry.
///
/// Refuses a path whose last component is not a plain name (the root, `.`,
/// `..`).
pub fn split_name<'a>(rel: &'a Path, given: &Path) -> Result<(&'a Path, &'a OsStr), FenceError> {
    match rel.components().next_back() {
        Some(Component::Normal(name)) => {
            let parent = rel.parent().filter(|p| !p.as_os_str().is_empty());
            Ok((parent.unwrap_or(Path::new(".")), name))
        }
        _ => Err(FenceError::NoFileName {
            path: given.to_path_buf(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(p: &str) -> Result<PathBuf, FenceError> {
        relative(Path::new(p), Path::new("/ws/project"))
    }

    #[test]
    fn plain_paths_stay_relative() {
        assert_eq!(rel("a/b.txt").unwrap(), Path::new("a/b.txt"));
        assert_eq!(rel("./a//b/").unwrap(), Path::new("a/b"));
        assert_eq!(rel("").unwrap(), Path::new("."));
        assert_eq!(rel(".").unwrap(), Path::new("."));
        assert_eq!(rel("a/../b").unwrap(), Path::new("a/../b"));
    }

    #[test]
    fn dot_dot_escape_is_refused() {
        for p in ["..", "../x", "a/../../x", "a/b/../../../etc/passwd"] {
            assert!(
                matches!(rel(p), Err(FenceError::DotDotEscape { .. })),
                "{p}"
            );
        }
    }

    #[test]
    fn absolute_paths_inside_the_workdir_are_accepted() {
        assert_eq!(rel("/ws/project/src/x").unwrap(), Path::new("src/x"));
        assert_eq!(rel("/ws/project").unwrap(), Path::new("."));
    }

    #[test]
    fn absolute_path_outside_is_refused() {
        for p in [
            "/etc/passwd",
            "/ws/projectX/a",
            "/ws",
            "/proc/self/root/etc",
        ] {
            assert!(
                matches!(rel(p), Err(FenceError::AbsoluteOutside { .. })),
                "{p}"
            );
        }
        assert!(matches!(
            rel("/ws/project/../other"),
            Err(FenceError::DotDotEscape { .. })
        ));
    }

    #[test]
    fn nul_byte_is_refused() {
        let p = Path::new(OsStr::from_bytes(b"a\0b"));
        let err = relative(p, Path::new("/ws")).unwrap_err();
        assert!(matches!(err, FenceError::NulByte { .. }));
        assert!(err.to_string().contains("a\\\\0b"), "{err}");
    }

    #[test]
    fn over_long_paths_are_refused() {
        let long = "a/".repeat(3000);
        assert!(matches!(
            rel(&long),
            Err(FenceError::TooLong { what: "path", .. })
        ));
        let name = "n".repeat(256);
        assert!(matches!(
            rel(&name),
            Err(FenceError::TooLong {
                what: "component",
                ..
            })
        ));
        // The message stays short whatever the input.
        assert!(rel(&long).unwrap_err().to_string().len() < 400);
    }

    #[test]
    fn split_name_needs_a_plain_final_component() {
        let (parent, name) = split_name(Path::new("a/b/c"), Path::new("a/b/c")).unwrap();
        assert_eq!((parent, name), (Path::new("a/b"), OsStr::new("c")));
        let (parent, name) = split_name(Path::new("c"), Path::new("c")).unwrap();
        assert_eq!((parent, name), (Path::new("."), OsStr::new("c")));
        for p in [".", "a/.."] {
            assert!(split_name(Path::new(p), Path::new(p)).is_err(), "{p}");
        }
    }
}
