//! `POST /upload`: a file, or a directory as a zip, sent as the
//! multipart form SWE-ReX's client posts (`file`, `target_path`,
//! `unzip`), written through the fence.
//!
//! The zip is read by this module, strictly: every entry is checked (its
//! name relative and without `..`, its sizes within bounds, its bytes
//! inflating to exactly its size with its CRC) before anything is written,
//! so a hostile or broken archive writes nothing. Entries become regular
//! files and directories only (as Python's `extractall` makes them);
//! every path then goes through the sandbox's fence like any other.

use std::path::{Component, Path, PathBuf};

use super::ops::{make_dirs, sandbox, write};
use super::{class, Fail};
use crate::multipart;
use crate::state::State;
use crate::MAX_BODY;

/// The most bytes a zip may unpack to in all (it is written to the
/// workspace, one entry in memory at a time).
const MAX_UNZIPPED: u64 = 1 << 30;

/// The most parts a form may have (SWE-ReX sends three).
const MAX_PARTS: usize = 16;

/// `POST /upload`.
pub(super) fn upload(state: &State, body: &[u8], content_type: &str) -> Result<(), Fail> {
    let form = Form::parse(body, content_type).map_err(Fail::invalid)?;
    let target = PathBuf::from(&form.target_path);
    if !form.unzip {
        let (id, sb) = sandbox(state)?;
        return write(state, id, sb.as_ref(), &target, form.file);
    }
    let refused = |why: String| {
        Fail::raise(
            class::VALUE,
            format!("the uploaded zip {why}; nothing was written"),
        )
    };
    let entries = entries(form.file).map_err(refused)?;
    // Every entry inflates to its size and CRC before one is written.
    for entry in &entries {
        contents(form.file, entry).map_err(refused)?;
    }
    let (id, sb) = sandbox(state)?;
    make_dirs(state, id, sb.as_ref(), &target)?;
    for entry in &entries {
        let path = target.join(&entry.name);
        if entry.dir {
            make_dirs(state, id, sb.as_ref(), &path)?;
        } else {
            let data = contents(form.file, entry).map_err(refused)?;
            write(state, id, sb.as_ref(), &path, &data)?;
        }
    }
    Ok(())
}

/// The fields of the upload form.
#[derive(Debug)]
struct Form<'a> {
    file: &'a [u8],
    target_path: String,
    unzip: bool,
}

impl<'a> Form<'a> {
    fn parse(body: &'a [u8], content_type: &str) -> Result<Form<'a>, String> {
        let (mut file, mut target_path, mut unzip) = (None, None, false);
        for part in multipart::parts(body, content_type, MAX_PARTS)? {
            let name = part
                .name
                .ok_or("a form part has no Content-Disposition name")?;
            let data = part.data;
            match name.as_str() {
                "file" => file = Some(data),
                "target_path" => {
                    let text = std::str::from_utf8(data)
                        .map_err(|_| "the form's target_path is not UTF-8".to_string())?;
                    target_path = Some(text.to_string());
                }
                "unzip" => unzip = boolean(data)?,
                // As FastAPI: a field the route does not take is ignored.
                _ => {}
            }
        }
        Ok(Form {
            file: file.ok_or("the form has no `file` field")?,
            target_path: target_path.ok_or("the form has no `target_path` field")?,
            unzip,
        })
    }
}

/// A form's boolean, as pydantic reads one.
fn boolean(data: &[u8]) -> Result<bool, String> {
    let text = String::from_utf8_lossy(data).trim().to_ascii_lowercase();
    match text.as_str() {
        "true" | "1" | "yes" | "on" | "t" | "y" => Ok(true),
        "false" | "0" | "no" | "off" | "f" | "n" => Ok(false),
        _ => Err(format!("the form's unzip is {text:?}, not a boolean")),
    }
}

/// One entry of a zip's central directory.
#[derive(Debug)]
struct Entry {
    /// Its path, relative, checked.
    name: PathBuf,
    dir: bool,
    method: u16,
    crc: u32,
    compressed: u64,
    size: u64,
    offset: u64,
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    data.get(at..at + 2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

const END_OF_DIRECTORY: u32 = 0x0605_4b50;
const DIRECTORY_ENTRY: u32 = 0x0201_4b50;
const LOCAL_HEADER: u32 = 0x0403_4b50;

/// The entries of a zip, every one checked (see the module's doc).
fn entries(zip: &[u8]) -> Result<Vec<Entry>, String> {
    let short = || "is cut short or not a zip".to_string();
    // The end-of-directory record: 22 bytes and a comment of up to 64 KiB.
    let lowest = zip.len().saturating_sub(22 + 0xffff);
    let end = (lowest..=zip.len().saturating_sub(22))
        .rev()
        .find(|&at| u32_at(zip, at) == Some(END_OF_DIRECTORY))
        .ok_or_else(short)?;
    let disks = (u16_at(zip, end + 4), u16_at(zip, end + 6));
    let count = u16_at(zip, end + 10).ok_or_else(short)?;
    let offset = u32_at(zip, end + 16).ok_or_else(short)?;
    if disks != (Some(0), Some(0)) {
        return Err("spans several disks".into());
    }
    if count == 0xffff || offset == 0xffff_ffff {
        return Err(
            "is a ZIP64 archive (more than 65,534 entries or 4 GiB), which hako does not unpack"
                .into(),
        );
    }
    let mut at = offset as usize;
    let mut total: u64 = 0;
    let mut out = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        if u32_at(zip, at) != Some(DIRECTORY_ENTRY) {
            return Err(short());
        }
        let field16 = |off| u16_at(zip, at + off).ok_or_else(short);
        let field32 = |off| u32_at(zip, at + off).ok_or_else(short);
        let flags = field16(8)?;
        let method = field16(10)?;
        let crc = field32(16)?;
        let compressed = u64::from(field32(20)?);
        let size = u64::from(field32(24)?);
        let name_len = usize::from(field16(28)?);
        let extra_len = usize::from(field16(30)?);
        let comment_len = usize::from(field16(32)?);
        let local = u64::from(field32(42)?);
        let raw = zip.get(at + 46..at + 46 + name_len).ok_or_else(short)?;
        let name = std::str::from_utf8(raw)
            .map_err(|_| "has an entry whose name is not UTF-8".to_string())?;
        if flags & 1 != 0 {
            return Err(format!("entry {name:?} is encrypted"));
        }
        if method != 0 && method != 8 {
            return Err(format!(
                "entry {name:?} is compressed by method {method} (hako unpacks stored and deflated entries)"
            ));
        }
        if size > MAX_BODY {
            return Err(format!(
                "entry {name:?} unpacks to {size} bytes; the most for one file is {MAX_BODY}"
            ));
        }
        total += size;
        if total > MAX_UNZIPPED {
            return Err(format!(
                "unpacks to more than {MAX_UNZIPPED} bytes, the most hako unpacks"
            ));
        }
        out.push(Entry {
            name: entry_path(name)?,
            dir: name.ends_with('/'),
            method,
            crc,
            compressed,
            size,
            offset: local,
        });
        at += 46 + name_len + extra_len + comment_len;
    }
    Ok(out)
}

/// An entry's name as a path under the target: relative, without `..`,
/// without a NUL (a zip-slip entry is refused, not rewritten).
fn entry_path(name: &str) -> Result<PathBuf, String> {
    let refused = |why: &str| Err(format!("has an entry {name:?} {why}"));
    if name.contains('\0') {
        return refused("with a NUL byte");
    }
    let path = Path::new(name);
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(part) => out.push(part),
            Component::CurDir => {}
            Component::ParentDir => return refused("that climbs out with `..`"),
            Component::RootDir | Component::Prefix(_) => return refused("with an absolute path"),
        }
    }
    if out.as_os_str().is_empty() {
        return refused("with an empty path");
    }
    Ok(out)
}

/// An entry's bytes, inflated, of exactly its size and CRC.
fn contents(zip: &[u8], entry: &Entry) -> Result<Vec<u8>, String> {
    let name = &entry.name;
    let bad = |why: &str| format!("entry {name:?} {why}");
    let at = usize::try_from(entry.offset).map_err(|_| bad("lies past the end"))?;
    if u32_at(zip, at) != Some(LOCAL_HEADER) {
        return Err(bad("has no local header where the directory says"));
    }
    let name_len = usize::from(u16_at(zip, at + 26).unwrap_or(0));
    let extra_len = usize::from(u16_at(zip, at + 28).unwrap_or(0));
    let start = at + 30 + name_len + extra_len;
    let compressed = usize::try_from(entry.compressed).map_err(|_| bad("is too large"))?;
    let raw = zip
        .get(start..start.saturating_add(compressed))
        .ok_or_else(|| bad("is cut short"))?;
    let size = usize::try_from(entry.size).map_err(|_| bad("is too large"))?;
    let data = match entry.method {
        0 => raw.to_vec(),
        _ => miniz_oxide::inflate::decompress_to_vec_with_limit(raw, size)
            .map_err(|_| bad("does not inflate to the size it declares"))?,
    };
    if data.len() != size {
        return Err(bad("does not hold the size it declares"));
    }
    if crc32(&data) != entry.crc {
        return Err(bad("does not match its CRC"));
    }
    Ok(data)
}

/// The CRC-32 zip uses (IEEE, reflected).
fn crc32(data: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in data {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::multipart::find;

    /// A zip of stored entries, as a test builds one by hand.
    fn stored_zip(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut zip = Vec::new();
        let mut directory = Vec::new();
        for (name, data) in files {
            let offset = zip.len() as u32;
            let crc = crc32(data);
            let header = |zip: &mut Vec<u8>, central: bool| {
                if central {
                    zip.extend_from_slice(&DIRECTORY_ENTRY.to_le_bytes());
                    zip.extend_from_slice(&20u16.to_le_bytes());
                } else {
                    zip.extend_from_slice(&LOCAL_HEADER.to_le_bytes());
                }
                zip.extend_from_slice(&20u16.to_le_bytes()); // version
                zip.extend_from_slice(&0u16.to_le_bytes()); // flags
                zip.extend_from_slice(&0u16.to_le_bytes()); // stored
                zip.extend_from_slice(&0u32.to_le_bytes()); // time, date
                zip.extend_from_slice(&crc.to_le_bytes());
                zip.extend_from_slice(&(data.len() as u32).to_le_bytes());
                zip.extend_from_slice(&(data.len() as u32).to_le_bytes());
                zip.extend_from_slice(&(name.len() as u16).to_le_bytes());
                zip.extend_from_slice(&0u16.to_le_bytes()); // extra
                if central {
                    zip.extend_from_slice(&[0u8; 10]); // comment, disk, attributes
                    zip.extend_from_slice(&offset.to_le_bytes());
                }
                zip.extend_from_slice(name.as_bytes());
            };
            header(&mut zip, false);
            zip.extend_from_slice(data);
            header(&mut directory, true);
        }
        let offset = zip.len() as u32;
        let size = directory.len() as u32;
        zip.extend_from_slice(&directory);
        zip.extend_from_slice(&END_OF_DIRECTORY.to_le_bytes());
        zip.extend_from_slice(&[0u8; 4]);
        zip.extend_from_slice(&(files.len() as u16).to_le_bytes());
        zip.extend_from_slice(&(files.len() as u16).to_le_bytes());
        zip.extend_from_slice(&size.to_le_bytes());
        zip.extend_from_slice(&offset.to_le_bytes());
        zip.extend_from_slice(&0u16.to_le_bytes());
        zip
    }

    #[test]
    fn crc32_is_zips() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn a_zip_is_read_entry_by_entry_with_its_sizes_and_crcs_checked() {
        let zip = stored_zip(&[("d/", b""), ("d/a.txt", b"alpha"), ("b", b"beta")]);
        let listed = entries(&zip).unwrap();
        let names: Vec<_> = listed.iter().map(|e| (e.name.clone(), e.dir)).collect();
        assert_eq!(
            names,
            [
                (PathBuf::from("d"), true),
                (PathBuf::from("d/a.txt"), false),
                (PathBuf::from("b"), false)
            ]
        );
        assert_eq!(contents(&zip, &listed[1]).unwrap(), b"alpha");
        // One byte of the data changed: its CRC no longer matches.
        let mut broken = zip.clone();
        let at = find(&broken, b"alpha").unwrap();
        broken[at] = b'A';
        assert!(contents(&broken, &listed[1]).unwrap_err().contains("CRC"));
        // Cut short, or not a zip at all.
        assert!(entries(&zip[..zip.len() - 30]).is_err());
        assert!(entries(b"not a zip").is_err());
    }

    #[test]
    fn zip_slip_entries_are_refused_not_rewritten() {
        for name in ["../evil", "a/../../evil", "/etc/evil", "a/\0b", "./"] {
            let zip = stored_zip(&[("ok", b"fine"), (name, b"x")]);
            let err = entries(&zip).unwrap_err();
            assert!(err.contains("has an entry"), "{name:?}: {err}");
        }
    }

    #[test]
    fn a_multipart_form_gives_its_fields_and_refuses_a_broken_one() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a;b.zip\"\r\nContent-Type: application/zip\r\n\r\nPK\r\n--XY\r\n--XyZ\r\nContent-Disposition: form-data; name=\"target_path\"\r\n\r\n/w/t\r\n--XyZ\r\nContent-Disposition: form-data; name=\"unzip\"\r\n\r\ntrue\r\n--XyZ--\r\n";
        let form = Form::parse(body, "multipart/form-data; boundary=XyZ").unwrap();
        assert_eq!(form.file, b"PK\r\n--XY");
        assert_eq!(form.target_path, "/w/t");
        assert!(form.unzip);
        let quoted = Form::parse(body, "Multipart/Form-Data; boundary=\"XyZ\"").unwrap();
        assert_eq!(quoted.target_path, "/w/t");
        assert!(Form::parse(body, "application/json").is_err());
        assert!(Form::parse(
            &body[..body.len() - 10],
            "multipart/form-data; boundary=XyZ"
        )
        .is_err());
        let no_target =
            b"--B\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n--B--\r\n";
        let err = Form::parse(no_target, "multipart/form-data; boundary=B").unwrap_err();
        assert!(err.contains("target_path"), "{err}");
    }
}
