//! The trees the copy-on-write benchmark works on, made fast: files
//! written straight from this process (no tool started per file), and
//! the tar of a tree written as a ustar stream from memory, never from
//! a tree on disk.
//!
//! A tree of `n` files has them at `dNNN/eN/fNNNNNN.txt`: 100 files to
//! a directory, 10 directories to a top one, as a source tree spreads
//! its files. File `i` is a few lines of text naming `i`, of a size that
//! varies with `i`.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Where file `i` of a tree is, relative to the tree.
pub(crate) fn file_path(i: usize) -> PathBuf {
    PathBuf::from(format!("d{:03}/e{}/f{i:06}.txt", i / 1000, (i / 100) % 10))
}

/// The content of file `i`: `lines` lines naming it (`lines` varies with
/// `i`, so sizes vary).
pub(crate) fn file_content(i: usize, min_lines: usize, spread: usize) -> Vec<u8> {
    let lines = min_lines + (i * 7919) % spread.max(1);
    format!("file {i}: a line of a small file of the tree\n")
        .repeat(lines)
        .into_bytes()
}

/// Writes a tree of `n` files under `root` (made if missing).
pub(crate) fn write_tree(
    root: &Path,
    n: usize,
    min_lines: usize,
    spread: usize,
) -> std::io::Result<()> {
    let mut last_dir = PathBuf::new();
    for i in 0..n {
        let path = root.join(file_path(i));
        if let Some(dir) = path.parent() {
            if dir != last_dir {
                std::fs::create_dir_all(dir)?;
                last_dir = dir.to_path_buf();
            }
        }
        std::fs::write(&path, file_content(i, min_lines, spread))?;
    }
    Ok(())
}

/// A ustar header for `name` (at most 100 bytes), a directory or a file
/// of `size` bytes.
fn ustar_header(name: &str, dir: bool, size: usize) -> std::io::Result<[u8; 512]> {
    let mut h = [0u8; 512];
    let name = name.as_bytes();
    if name.len() > 100 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a tar name longer than 100 bytes",
        ));
    }
    h[..name.len()].copy_from_slice(name);
    let mut field = |at: usize, len: usize, value: u64| {
        let text = format!("{value:0width$o}\0", width = len - 1);
        h[at..at + len].copy_from_slice(text.as_bytes());
    };
    field(100, 8, if dir { 0o755 } else { 0o644 });
    field(108, 8, 0);
    field(116, 8, 0);
    field(124, 12, size as u64);
    // A fixed time: 2024-01-01.
    field(136, 12, 1_704_067_200);
    h[156] = if dir { b'5' } else { b'0' };
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // The checksum: the header's bytes summed with its own field as spaces.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(text.as_bytes());
    Ok(h)
}

/// Writes, at `path`, a ustar archive of the tree [`write_tree`] would
/// make with the same arguments (directories first in each, then files).
pub(crate) fn write_tar(
    path: &Path,
    n: usize,
    min_lines: usize,
    spread: usize,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut dirs_made = std::collections::BTreeSet::new();
    for i in 0..n {
        let rel = file_path(i);
        let mut ancestors: Vec<&Path> = rel
            .ancestors()
            .skip(1)
            .filter(|a| !a.as_os_str().is_empty())
            .collect();
        ancestors.reverse();
        for dir in ancestors {
            if dirs_made.insert(dir.to_path_buf()) {
                out.write_all(&ustar_header(&format!("{}/", dir.display()), true, 0)?)?;
            }
        }
        let data = file_content(i, min_lines, spread);
        out.write_all(&ustar_header(
            &rel.display().to_string(),
            false,
            data.len(),
        )?)?;
        out.write_all(&data)?;
        let pad = (512 - data.len() % 512) % 512;
        out.write_all(&vec![0u8; pad])?;
    }
    out.write_all(&[0u8; 1024])?;
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tar_holds_the_tree_write_tree_makes_as_tar_reads_it() {
        let dir = std::env::temp_dir().join(format!("hako-bench-trees-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let made = dir.join("made");
        let unpacked = dir.join("unpacked");
        let mk = |p: &Path| std::fs::create_dir_all(p).unwrap_or_else(|e| panic!("{e}"));
        mk(&made);
        mk(&unpacked);
        write_tree(&made, 1_234, 2, 5).unwrap_or_else(|e| panic!("{e}"));
        let tar = dir.join("t.tar");
        write_tar(&tar, 1_234, 2, 5).unwrap_or_else(|e| panic!("{e}"));
        let status = std::process::Command::new("tar")
            .arg("--no-same-owner")
            .arg("-xf")
            .arg(&tar)
            .arg("-C")
            .arg(&unpacked)
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success());
        let diff = std::process::Command::new("diff")
            .arg("-r")
            .arg(&made)
            .arg(&unpacked)
            .status()
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(diff.success(), "the unpacked tree differs");
        assert_eq!(
            std::fs::read(unpacked.join("d001/e2/f001233.txt")).ok(),
            Some(file_content(1_233, 2, 5))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
