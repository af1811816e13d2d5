//! A minimal C ABI over [`l3_cuda::BatchDecoder`]'s sample batches, loaded by `scripts/overlap.py` with
//! `ctypes` (a stand-in until the PyO3 package with DLPack export exists): Python hands in file paths and
//! windows, gets back a device pointer it wraps (CuPy `UnownedMemory` → `torch.from_dlpack`), makes its
//! stream wait on the batch, and frees it in that stream's order when done.
//!
//! Build: `cargo build -p l3-cuda --release --example l3_ctypes` → `target/release/examples/libl3_ctypes.so`.
//!
//! Files are read the way a loader reads them for a crop: the header and offset table first, then only the
//! byte ranges of the patches under the window ([`l3_format::L3Index::region_ranges`], `pread`), unless
//! the window is the whole image (then the whole file is read).
//!
//! Every function returns 0 / a non-null handle on success; on failure the reason is kept for
//! `l3c_last_error`. Nothing panics across the boundary.

use l3_cuda::{
    BatchDecoder, DType, DecodedBatch, Layout, Normalize, Rect, SampleOptions, SampleSource, Window,
};
use l3_format::{Fragments, L3Index};
use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_int};
use std::os::unix::fs::FileExt;

thread_local! {
    static LAST_ERROR: RefCell<String> = const { RefCell::new(String::new()) };
}

fn fail(msg: impl std::fmt::Display) {
    LAST_ERROR.with(|e| *e.borrow_mut() = msg.to_string());
}

/// Copies the last error message of this thread into `buf` (NUL-terminated, truncated to `len`); returns
/// its full length.
///
/// # Safety
/// `buf` must point to `len` writable bytes (or be null with `len` 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_last_error(buf: *mut c_char, len: usize) -> usize {
    LAST_ERROR.with(|e| {
        let msg = e.borrow();
        if !buf.is_null() && len > 0 {
            let n = msg.len().min(len - 1);
            // SAFETY: the caller vouches for `len` bytes at `buf`; n + 1 <= len.
            unsafe {
                std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
                *buf.add(n) = 0;
            }
        }
        msg.len()
    })
}

/// A decoder on device `ordinal` with at most `max_in_flight` batches queued; null on failure (no driver,
/// no device, no NVRTC, ...: see `l3c_last_error`).
#[unsafe(no_mangle)]
pub extern "C" fn l3c_open(ordinal: c_int, max_in_flight: c_int) -> *mut BatchDecoder {
    match BatchDecoder::new(ordinal.max(0) as usize) {
        Ok(mut d) => {
            d.set_max_in_flight(max_in_flight.max(1) as usize);
            Box::into_raw(Box::new(d))
        }
        Err(e) => {
            fail(e);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// `dec` must come from `l3c_open` and not be used afterwards.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_close(dec: *mut BatchDecoder) {
    if !dec.is_null() {
        // SAFETY: from Box::into_raw in l3c_open, closed once.
        drop(unsafe { Box::from_raw(dec) });
    }
}

/// The bytes of one file a window needs: the whole file, or its index and the patch ranges under `src`.
enum Read {
    Whole(Vec<u8>),
    Parts(L3Index, Fragments),
}

fn read_for(path: &str, src: Rect) -> Result<Read, String> {
    let err = |e: &dyn std::fmt::Display| format!("{path}: {e}");
    let file = std::fs::File::open(path).map_err(|e| err(&e))?;
    let len = file.metadata().map_err(|e| err(&e))?.len();
    let mut prefix = Vec::new();
    while let Some(r) = L3Index::next_read(&prefix, len).map_err(|e| err(&e))? {
        let at = prefix.len();
        prefix.resize(r.end as usize, 0);
        file.read_exact_at(&mut prefix[at..], r.start)
            .map_err(|e| err(&e))?;
    }
    let index = L3Index::parse(&prefix, len).map_err(|e| err(&e))?;
    if src == Rect::new(0, 0, index.width(), index.height()) {
        let mut all = vec![0u8; len as usize];
        file.read_exact_at(&mut all, 0).map_err(|e| err(&e))?;
        return Ok(Read::Whole(all));
    }
    let ranges = index.region_ranges(src, 4096).map_err(|e| err(&e))?;
    let mut data = Fragments::new();
    data.reset(&ranges);
    for (r, dst) in data.slices_mut() {
        file.read_exact_at(dst, r.start).map_err(|e| err(&e))?;
    }
    Ok(Read::Parts(index, data))
}

/// Reads `n` files and queues ONE sample batch: sample i is window `windows[6i..6i+6]` = (x, y, w, h, dx,
/// dy) of file `paths[i]`, mirrored when `flips[i]` != 0, into `width`×`height`×3 samples; `layout` 0 =
/// NHWC, 1 = NCHW; `dtype` 0 = u8, 1 = f16, 2 = f32; `imagenet` != 0 normalises with the ImageNet
/// statistics. Returns the batch (null on failure). A full window that does not fit an image's size is
/// an error like any other (see `l3c_last_error`).
///
/// # Safety
/// `dec` from `l3c_open`; `paths` holds `n` NUL-terminated strings; `windows` 6·n values; `flips` n bytes.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn l3c_submit(
    dec: *mut BatchDecoder,
    paths: *const *const c_char,
    n: usize,
    windows: *const u32,
    flips: *const u8,
    width: u32,
    height: u32,
    layout: c_int,
    dtype: c_int,
    imagenet: c_int,
) -> *mut DecodedBatch {
    // SAFETY: the caller vouches for every pointer (see above).
    let (dec, paths, windows, flips) = unsafe {
        if dec.is_null() || n == 0 || paths.is_null() || windows.is_null() || flips.is_null() {
            fail("l3c_submit: null argument or empty batch");
            return std::ptr::null_mut();
        }
        (
            &mut *dec,
            std::slice::from_raw_parts(paths, n),
            std::slice::from_raw_parts(windows, 6 * n),
            std::slice::from_raw_parts(flips, n),
        )
    };
    let wins: Vec<Window> = (0..n)
        .map(|i| {
            let w = &windows[6 * i..6 * i + 6];
            Window::new(Rect::new(w[0], w[1], w[2], w[3]), w[4], w[5], flips[i] != 0)
        })
        .collect();
    let mut reads = Vec::with_capacity(n);
    for (&p, w) in paths.iter().zip(&wins) {
        // SAFETY: NUL-terminated, per the contract.
        let path = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        match read_for(&path, w.src) {
            Ok(r) => reads.push(r),
            Err(e) => {
                fail(e);
                return std::ptr::null_mut();
            }
        }
    }
    let sources: Vec<SampleSource<'_>> = reads
        .iter()
        .map(|r| match r {
            Read::Whole(b) => SampleSource::File(b),
            Read::Parts(index, data) => SampleSource::Fragments { index, data },
        })
        .collect();
    let opts = SampleOptions {
        layout: if layout == 0 {
            Layout::Nhwc
        } else {
            Layout::Nchw
        },
        dtype: match dtype {
            0 => DType::U8,
            1 => DType::F16,
            _ => DType::F32,
        },
        normalize: (imagenet != 0 && dtype != 0).then_some(Normalize::IMAGENET),
        ..SampleOptions::new(width, height)
    };
    match dec.submit_samples(&sources, &wins, &opts) {
        Ok(b) => Box::into_raw(Box::new(b)),
        Err(e) => {
            fail(e);
            std::ptr::null_mut()
        }
    }
}

/// The batch's device pointer (`CUdeviceptr`).
///
/// # Safety
/// `b` from `l3c_submit`, not yet released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_batch_ptr(b: *const DecodedBatch) -> u64 {
    // SAFETY: per the contract.
    unsafe { b.as_ref() }.map_or(0, DecodedBatch::device_ptr)
}

/// The batch's size in bytes.
///
/// # Safety
/// `b` from `l3c_submit`, not yet released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_batch_bytes(b: *const DecodedBatch) -> usize {
    // SAFETY: per the contract.
    unsafe { b.as_ref() }.map_or(0, DecodedBatch::byte_len)
}

/// Makes `stream` (a `CUstream`, e.g. `torch.cuda.current_stream().cuda_stream`) wait for the decode.
///
/// # Safety
/// `b` from `l3c_submit`, not yet released; `stream` a live stream of the same device's primary context.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_batch_wait_in(b: *const DecodedBatch, stream: u64) -> c_int {
    // SAFETY: per the contract.
    let Some(b) = (unsafe { b.as_ref() }) else {
        fail("l3c_batch_wait_in: null batch");
        return -1;
    };
    // SAFETY: per the contract.
    match unsafe { b.wait_in(stream as l3_cuda::cudarc::driver::sys::CUstream) } {
        Ok(()) => 0,
        Err(e) => {
            fail(e);
            -1
        }
    }
}

/// Blocks until the batch is decoded; -1 (with the reason) if a patch was corrupt.
///
/// # Safety
/// `b` from `l3c_submit`, not yet released.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_batch_wait(b: *const DecodedBatch) -> c_int {
    // SAFETY: per the contract.
    let Some(b) = (unsafe { b.as_ref() }) else {
        fail("l3c_batch_wait: null batch");
        return -1;
    };
    match b.wait() {
        Ok(()) => 0,
        Err(e) => {
            fail(e);
            -1
        }
    }
}

/// Releases the batch; its memory is freed in `stream`'s order (after the work queued there so far), or
/// at once on the decode stream when `stream` is 0.
///
/// # Safety
/// `b` from `l3c_submit`, released once; `stream` 0 or a live stream of the same context; nothing may
/// use the pointer after work queued on `stream` from now on.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn l3c_batch_release(b: *mut DecodedBatch, stream: u64) -> c_int {
    if b.is_null() {
        return 0;
    }
    // SAFETY: from Box::into_raw in l3c_submit, released once.
    let b = unsafe { Box::from_raw(b) };
    if stream == 0 {
        drop(b);
        return 0;
    }
    // SAFETY: per the contract.
    match unsafe { b.free_after(stream as l3_cuda::cudarc::driver::sys::CUstream) } {
        Ok(()) => 0,
        Err(e) => {
            fail(e);
            -1
        }
    }
}
