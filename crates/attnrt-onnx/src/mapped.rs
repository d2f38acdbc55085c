//! File contents as [`Bytes`]: large files mapped into memory (read-only, private) rather than
//! read and copied, small ones read. A model decoded from these bytes shares them: every
//! initializer's `raw_data` is a slice of the mapping, so its weights are paged in from the file
//! when first read, held by the page cache rather than the heap, and never copied by loading,
//! fusing or saving.
//!
//! A mapping lives as long as any slice of it. Files are only ever replaced by a rename
//! ([`crate::save::write_atomic`]), which leaves a mapped file's contents in place; a file
//! truncated by another program while mapped would fault on the next read of the lost part, as
//! it does in every engine that maps its weights (ONNX Runtime, tract).
//!
//! [`release`] gives the pages of a slice back once their values have been copied elsewhere
//! (into tract's tensors, or packed for a kernel): they are re-read from the file if the slice
//! is read again, so the values never change, and the process's resident memory holds the
//! weights once rather than once in the mapping and once in the copy.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result};
use bytes::Bytes;

/// Files smaller than this are read into the heap: a mapping costs a system call and at least
/// a page, and small models (tests, fixtures) gain nothing from it.
pub const MAP_AT_LEAST: u64 = 1 << 20;

/// The address ranges (start, end) of the mappings this module made and that are alive.
static MAPPINGS: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

/// A read-only private mapping, registered in [`MAPPINGS`] while it lives.
struct Mapping(memmap2::Mmap);

impl Mapping {
    fn range(&self) -> (usize, usize) {
        let start = self.0.as_ptr() as usize;
        (start, start + self.0.len())
    }
}

impl AsRef<[u8]> for Mapping {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        let range = self.range();
        let mut maps = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = maps.iter().position(|&r| r == range) {
            maps.swap_remove(at);
        }
    }
}

/// The contents of `file` (of `len` bytes, as its metadata says): mapped when it has at least
/// [`MAP_AT_LEAST`] bytes, read otherwise. `what` names the file in errors.
pub fn file_bytes(mut file: File, len: u64, what: &str) -> Result<Bytes> {
    if len < MAP_AT_LEAST {
        let mut data = Vec::with_capacity(len as usize);
        file.read_to_end(&mut data)
            .with_context(|| format!("{what}: cannot read"))?;
        return Ok(Bytes::from(data));
    }
    // Safety: the mapping is read-only and private; attnrt replaces files only by renaming a
    // new file over them, which leaves the mapped contents untouched (see the module doc).
    let map = unsafe { memmap2::MmapOptions::new().map(&file) }
        .with_context(|| format!("{what}: cannot map {len} bytes"))?;
    let mapping = Mapping(map);
    MAPPINGS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(mapping.range());
    Ok(Bytes::from_owner(mapping))
}

/// The contents of the file at `path` (see [`file_bytes`]).
pub fn read_path(path: &Path, what: &str) -> Result<Bytes> {
    let file = File::open(path).with_context(|| format!("{what}: cannot read"))?;
    let len = file
        .metadata()
        .with_context(|| format!("{what}: cannot read"))?
        .len();
    file_bytes(file, len, what)
}

/// Whether `data` lies inside a live mapping made by this module.
pub fn is_mapped(data: &[u8]) -> bool {
    let (start, end) = (data.as_ptr() as usize, data.as_ptr() as usize + data.len());
    let maps = MAPPINGS.lock().unwrap_or_else(|e| e.into_inner());
    maps.iter().any(|&(s, e)| s <= start && end <= e)
}

/// Gives back to the system the whole pages of `data` when it lies in a mapping made by this
/// module (otherwise does nothing): a later read of them pages them in from the file again, so
/// `data` keeps its values. Call it once the values have been copied where they are used.
pub fn release(data: &[u8]) {
    #[cfg(unix)]
    {
        if data.is_empty() || !is_mapped(data) {
            return;
        }
        let page = page_size();
        let start = (data.as_ptr() as usize).div_ceil(page) * page;
        let end = (data.as_ptr() as usize + data.len()) / page * page;
        if end > start {
            // Safety: the range lies inside a live read-only private file mapping (checked
            // above); MADV_DONTNEED on it drops clean pages, which are read from the file again
            // on the next access, so no value changes.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
            }
        }
    }
}

#[cfg(unix)]
fn page_size() -> usize {
    // Safety: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_files_are_mapped_and_released_pages_keep_their_values() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.bin");
        let data: Vec<u8> = (0..(MAP_AT_LEAST as usize * 2))
            .map(|i| (i % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let bytes = read_path(&path, "w.bin").unwrap();
        assert_eq!(&bytes[..], &data[..]);
        let part = bytes.slice(100..MAP_AT_LEAST as usize + 5000);
        assert!(is_mapped(&part));
        release(&part);
        assert_eq!(&part[..], &data[100..MAP_AT_LEAST as usize + 5000]);
        let range = (bytes.as_ptr() as usize, bytes.len());
        drop((bytes, part));
        let gone = MAPPINGS.lock().unwrap().iter().all(|&(s, _)| s != range.0);
        assert!(gone, "the mapping is forgotten when its last slice goes");
    }

    #[test]
    fn small_files_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.bin");
        std::fs::write(&path, [1u8, 2, 3]).unwrap();
        let bytes = read_path(&path, "s.bin").unwrap();
        assert_eq!(&bytes[..], &[1, 2, 3]);
        assert!(!is_mapped(&bytes));
        release(&bytes);
    }
}
