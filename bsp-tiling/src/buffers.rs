//! The large f32 buffers of a run, handed back between supersteps and taken again.
//!
//! A tile's input window, its output and a stored value's tiles are tens of MiB each, made in every
//! superstep. Buffers that large come straight from the kernel, which faults them in and zeroes them on
//! first touch: profiles of the ONNX models at 2048² spent a third (U-Net) to a half (the 4× upscaler) of
//! their time there, most of it zeroing. So buffers a run is done with are handed back ([`give`]) and
//! reused, and a buffer its user overwrites whole is taken as it is ([`scratch`]): neither the kernel nor
//! a memset zeroes it again. What the pool holds is resident memory the run's planner did not give to
//! a stored value, so the exact engine sets its bound ([`limit`]) superstep by superstep to what the
//! plan leaves: the stored values' planned peak less those stored now, plus the tiles' working sets.
//! A run [`clear`]s what is left when it ends. (Transparent huge pages for fresh buffers were tried too: fewer faults, but more system time in
//! zeroing and compacting 2 MiB pages — the 4× upscaler at 1024² took 9 s of system time instead of 3.5.)

use crate::error::{Error, Result};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes held for reuse at most; a buffer handed back past this is freed.
pub const CAP_BYTES: usize = 1 << 30;

/// The bound in force: [`CAP_BYTES`], or what the running superstep's plan leaves ([`limit`]).
static LIMIT: AtomicUsize = AtomicUsize::new(CAP_BYTES);

/// Holds at most `bytes` (never more than [`CAP_BYTES`]), freeing what is held past it now. Process-wide:
/// the last caller sets it.
pub fn limit(bytes: u64) {
    let bytes = bytes.min(CAP_BYTES as u64) as usize;
    LIMIT.store(bytes, Ordering::Relaxed);
    let mut p = pool();
    while p.bytes > bytes {
        match p.bufs.pop() {
            Some(v) => p.bytes -= v.capacity() * 4,
            None => break,
        }
    }
}

/// Buffers shorter than this (256 KiB) are left to the allocator, whose own free lists serve them well.
const MIN_LEN: usize = 1 << 16;

struct Pool {
    bufs: Vec<Vec<f32>>,
    bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    bufs: Vec::new(),
    bytes: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A held buffer of capacity `n` to `4n` (the smallest), its length set to `n`; old values stay. A larger
/// buffer than asked for is still resident memory saved: a network's later, smaller values take the
/// buffers of its earlier, larger ones instead of faulting in new ones.
fn take(n: usize) -> Option<Vec<f32>> {
    if n < MIN_LEN {
        return None;
    }
    let mut p = pool();
    let i = p
        .bufs
        .iter()
        .enumerate()
        .filter(|(_, b)| b.capacity() >= n && b.capacity() / 4 <= n)
        .min_by_key(|(_, b)| b.capacity())
        .map(|(i, _)| i)?;
    let mut v = p.bufs.swap_remove(i);
    p.bytes -= v.capacity() * 4;
    drop(p);
    // Shrinking keeps the first n values; growing within the capacity writes zeros.
    v.resize(n, 0.0);
    Some(v)
}

/// A zeroed buffer of length `n`; [`Error::OutOfMemory`] when the allocator refuses it.
pub fn zeros(n: usize) -> Result<Vec<f32>> {
    match take(n) {
        Some(mut v) => {
            v.fill(0.0);
            Ok(v)
        }
        None => fresh(n),
    }
}

/// A buffer of length `n` whose values are left from an earlier use (zeros when fresh): for a caller that
/// writes every element before reading any. [`Error::OutOfMemory`] when the allocator refuses it.
pub fn scratch(n: usize) -> Result<Vec<f32>> {
    match take(n) {
        Some(v) => Ok(v),
        None => fresh(n),
    }
}

/// Hands `v` back for reuse (freed when it is small or the pool is full).
pub fn give(v: Vec<f32>) {
    let bytes = v.capacity() * 4;
    if v.capacity() < MIN_LEN {
        return;
    }
    let mut p = pool();
    if p.bytes + bytes <= LIMIT.load(Ordering::Relaxed) {
        p.bytes += bytes;
        p.bufs.push(v);
    }
}

/// Frees every buffer held.
pub fn clear() {
    let bufs = {
        let mut p = pool();
        p.bytes = 0;
        std::mem::take(&mut p.bufs)
    };
    drop(bufs);
}

/// A new zeroed buffer: the allocator's, a large one a fresh mapping, whose pages are then populated in
/// one call instead of one page fault each as they are first written (in a VM each fault is a trap to
/// the kernel, and two threads faulting at once contend for the mapping's lock). A refusal is
/// [`Error::OutOfMemory`], not the abort `vec!` makes of it: under a process limit (`ulimit -v`, a
/// container's) the run ends with an error that says so, and whatever it writes is left whole.
fn fresh(n: usize) -> Result<Vec<f32>> {
    let v = zeroed(n).ok_or(Error::OutOfMemory {
        bytes: (n as u64).saturating_mul(4),
    })?;
    populate(&v);
    Ok(v)
}

/// `vec![0.0f32; n]` (calloc: fresh pages are zero without a memset), or `None` where that would abort.
#[allow(unsafe_code)]
fn zeroed(n: usize) -> Option<Vec<f32>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(n).ok()?;
    // SAFETY: `layout` has a non-zero size; a non-null pointer from `alloc_zeroed` is an allocation of the
    // global allocator with exactly the layout of `n` f32s (all zero bits, a valid 0.0 each), which is
    // what `Vec::from_raw_parts` takes over with length and capacity `n`.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<f32>();
        (!p.is_null()).then(|| Vec::from_raw_parts(p, n, n))
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn populate(v: &[f32]) {
    const PAGE: usize = 4096;
    let start = (v.as_ptr() as usize).next_multiple_of(PAGE);
    let end = (v.as_ptr() as usize + std::mem::size_of_val(v)) / PAGE * PAGE;
    if end > start {
        // SAFETY: the range lies within `v`'s allocation; MADV_POPULATE_WRITE only faults its pages in
        // (zero pages stay zero). A kernel without it (before 5.14) says EINVAL and nothing happens.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_POPULATE_WRITE,
            );
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn populate(_: &[f32]) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_are_zero_fresh_or_reused() {
        for n in [0, 1, 1000, MIN_LEN - 1, MIN_LEN + 12345] {
            let v = zeros(n).unwrap();
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 0.0));
        }
        let mut v = zeros(MIN_LEN * 3).unwrap();
        v.iter_mut().for_each(|x| *x = 7.0);
        give(v);
        for n in [MIN_LEN * 2, MIN_LEN * 3] {
            let w = zeros(n).unwrap();
            assert_eq!(w.len(), n);
            assert!(w.iter().all(|&x| x == 0.0));
            give(w);
        }
        let s = scratch(MIN_LEN * 2).unwrap();
        assert_eq!(s.len(), MIN_LEN * 2);
        clear();
    }

    /// A buffer the allocator cannot give is an error naming its size, not an abort: past the address
    /// space (the layout itself fails) and far past any machine's memory (the allocator says no).
    #[test]
    fn a_refused_allocation_is_an_error() {
        for n in [usize::MAX / 2, 1usize << 60] {
            for got in [zeros(n), scratch(n)] {
                match got {
                    Err(Error::OutOfMemory { bytes }) => {
                        assert_eq!(bytes, (n as u64).saturating_mul(4));
                    }
                    other => panic!("{n} f32s: {:?}", other.map(|v| v.len())),
                }
            }
        }
        let e = zeros(1usize << 60).unwrap_err().to_string();
        assert!(e.contains("out of memory") && e.contains("MiB"), "{e}");
    }
}
