//! Large zeroed f32 buffers on transparent huge pages.
//!
//! A tile's input window, its output and a stored value's tiles are tens of MiB each, allocated fresh in
//! every superstep. The allocator maps buffers that large straight from the kernel, which faults them in
//! and zeroes them 4 KiB at a time on first touch: profiles of the ONNX models at 2048² spent a third of
//! their time there. Asking for transparent huge pages over such a buffer before it is touched (where THP
//! is in `madvise` mode, the default of many distributions) makes each fault bring 2 MiB. A pool of
//! reused buffers was tried first: it cut the faults too but held up to its cap in extra resident memory,
//! and measured slower than huge pages alone.

/// Below this (8 MiB) a buffer is left to the allocator as it is.
const HUGE_MIN_BYTES: usize = 8 << 20;

/// A zeroed buffer of length `n`; from [`HUGE_MIN_BYTES`] on, advised onto huge pages. Only advice: where
/// the kernel declines, the buffer is the same.
pub fn zeros(n: usize) -> Vec<f32> {
    // A large calloc is a fresh, untouched mapping: the advice applies before any page is faulted in.
    let v = vec![0.0f32; n];
    #[cfg(target_os = "linux")]
    if n * 4 >= HUGE_MIN_BYTES {
        const HUGE: usize = 2 << 20;
        let start = (v.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (v.as_ptr() as usize + n * 4) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside `v`'s allocation; MADV_HUGEPAGE changes neither contents nor
            // mapping, only how later faults are served.
            #[allow(unsafe_code)]
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn buffers_of_every_size_are_zeroed() {
        for n in [0, 1, 1000, (8 << 20) / 4 - 1, (8 << 20) / 4 + 12345] {
            let v = super::zeros(n);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 0.0));
        }
    }
}
