//! Large f32 buffers handed back between the supersteps of a run and taken again.
//!
//! A tile's input window, its output and a stored value's tiles are tens of MiB each. The allocator gives
//! buffers that large back to the kernel when they are freed and maps fresh pages for the next one, which
//! the kernel must fault in and zero: profiles of the ONNX models at 2048² spent a third of their time
//! there. Buffers returned with [`give`] are reused by [`zeros`] (smallest that fits, at most twice the
//! length asked for), up to [`CAP_BYTES`] held; a run [`clear`]s what is left when it ends.

use std::sync::Mutex;

/// Bytes held for reuse at most; a buffer returned past this is freed.
pub const CAP_BYTES: usize = 1 << 30;

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

/// A zeroed buffer of length `n`: a returned one when one fits, else a fresh allocation.
pub fn zeros(n: usize) -> Vec<f32> {
    if n >= MIN_LEN {
        let mut p = pool();
        let best = p
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= n && b.capacity() / 2 <= n)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut v = p.bufs.swap_remove(i);
            p.bytes -= v.capacity() * 4;
            drop(p);
            v.clear();
            v.resize(n, 0.0);
            return v;
        }
    }
    vec![0.0; n]
}

/// Hands `v` back for reuse (freed when it is small or the pool is full).
pub fn give(v: Vec<f32>) {
    let bytes = v.capacity() * 4;
    if v.capacity() < MIN_LEN {
        return;
    }
    let mut p = pool();
    if p.bytes + bytes <= CAP_BYTES {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_returned_buffer_comes_back_zeroed() {
        let mut v = zeros(MIN_LEN * 3);
        v.iter_mut().for_each(|x| *x = 7.0);
        let ptr = v.as_ptr();
        give(v);
        let w = zeros(MIN_LEN * 2);
        assert_eq!(w.len(), MIN_LEN * 2);
        assert!(w.iter().all(|&x| x == 0.0));
        // Other tests may share the pool, so reuse itself is only checked when this buffer came back.
        if w.as_ptr() == ptr {
            assert!(w.capacity() >= MIN_LEN * 3);
        }
        give(w);
        // Too large a buffer for the length asked is not handed out.
        let small = zeros(MIN_LEN);
        assert!(small.capacity() < MIN_LEN * 3 || small.as_ptr() != ptr);
        clear();
    }
}
