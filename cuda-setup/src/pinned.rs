//! Page-locked host memory: what a host buffer must be for the GPU to copy it by DMA, asynchronously and
//! at full bus speed (pageable memory goes through a driver bounce buffer, synchronously). For batch
//! buffers a training step hands to the GPU (`pin_memory=True`).
#![allow(unsafe_code)]

use crate::{Error, Library};
use cudarc::driver::{CudaContext, CudaEvent, result, sys};
use std::ptr::NonNull;
use std::sync::Arc;

/// The alignment every [`PinnedHost`] buffer has at least (the driver gives whole pages).
const ALIGN: usize = 64;

/// `len` bytes of page-locked host memory (`cuMemHostAlloc`, portable: pinned for every context of the
/// process), zeroed, aligned to at least 64 bytes, freed on drop.
pub struct PinnedHost {
    ptr: NonNull<u8>,
    len: usize,
    /// The context the memory was allocated in: it must outlive the allocation.
    ctx: Arc<CudaContext>,
    /// The work a reader of the memory queued before it was released (see [`PinnedHost::fence`]).
    fence: Option<CudaEvent>,
}

// SAFETY: the buffer is owned exclusively (like a Box<[u8]>): shared access only reads through &self,
// writes need &mut self; the context handle is Send + Sync.
unsafe impl Send for PinnedHost {}
// SAFETY: as above.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// `len` zeroed bytes, allocated in device 0's primary context. Without a usable driver or device this
    /// is the reason ([`Error::Missing`], [`Error::Init`], [`Error::NoDevice`]), never a pageable stand-in.
    pub fn alloc(len: usize) -> Result<PinnedHost, Error> {
        Library::Driver.require()?;
        PinnedHost::alloc_in(&crate::open(0)?, len)
    }

    /// `len` zeroed bytes, allocated in `ctx`.
    pub fn alloc_in(ctx: &Arc<CudaContext>, len: usize) -> Result<PinnedHost, Error> {
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // The driver refuses 0 bytes; an empty buffer still holds one.
        let bytes = len.max(1);
        // SAFETY: a plain allocation in the current context (bound above); freed in Drop.
        let raw = unsafe { result::malloc_host(bytes, sys::CU_MEMHOSTALLOC_PORTABLE) }
            .map_err(|e| Error::driver("cuMemHostAlloc", e))?;
        let Some(ptr) = NonNull::new(raw.cast::<u8>()) else {
            return Err(Error::Driver {
                call: "cuMemHostAlloc",
                message: "returned a null pointer".into(),
            });
        };
        let buf = PinnedHost {
            ptr,
            len,
            ctx: ctx.clone(),
            fence: None,
        };
        if !(ptr.as_ptr() as usize).is_multiple_of(ALIGN) {
            // Dropping `buf` frees it.
            return Err(Error::Driver {
                call: "cuMemHostAlloc",
                message: format!("returned memory aligned to fewer than {ALIGN} bytes"),
            });
        }
        // SAFETY: `bytes` writable bytes just allocated; zeroed so that every byte is initialised before
        // a slice of them exists.
        unsafe { ptr.as_ptr().write_bytes(0, bytes) };
        Ok(buf)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Marks the work queued so far on the device's legacy default stream — where PyTorch, CuPy and JAX
    /// queue a `non_blocking` copy unless told otherwise — as the last that may still read this memory.
    /// Recycled buffers call it when their consumer lets go, and [`PinnedHost::wait_fence`] before they
    /// are written again, so that an asynchronous copy out of one batch never sees the next batch's bytes.
    /// Work on another stream is not covered: the consumer must have synchronised it before letting go.
    pub fn fence(&mut self) -> Result<(), Error> {
        let event = match self.fence.take() {
            Some(e) => e,
            None => self
                .ctx
                .new_event(None)
                .map_err(|e| Error::driver("cuEventCreate", e))?,
        };
        event
            .record(&self.ctx.default_stream())
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        self.fence = Some(event);
        Ok(())
    }

    /// Waits until the work marked by the last [`PinnedHost::fence`] has finished (at once if none).
    pub fn wait_fence(&self) -> Result<(), Error> {
        match &self.fence {
            Some(e) => e
                .synchronize()
                .map_err(|e| Error::driver("cuEventSynchronize", e)),
            None => Ok(()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The first byte, for a copy the caller queues (`cuMemcpyHtoDAsync`); valid while `self` lives.
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation), owned by self, shared borrow.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, exclusive borrow.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for PinnedHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHost")
            .field("len", &self.len)
            .field("device", &self.ctx.ordinal())
            .finish()
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc in `ctx` (still alive: held by self), freed once, here.
        let freed = self
            .ctx
            .bind_to_thread()
            .and_then(|()| unsafe { result::free_host(self.ptr.as_ptr().cast()) });
        if let Err(e) = freed {
            // Nothing to return to: say so rather than leak in silence.
            eprintln!(
                "cuda-setup: freeing {} bytes of pinned memory: {}",
                self.len,
                crate::describe(&e)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_send_and_sync() {
        fn both<T: Send + Sync>() {}
        both::<PinnedHost>();
    }

    #[test]
    fn no_driver_is_a_typed_error() {
        if Library::Driver.is_present() {
            eprintln!("skipping: libcuda is present here");
            return;
        }
        let e = PinnedHost::alloc(1 << 20).unwrap_err();
        assert_eq!(e, Error::Missing(Library::Driver));
        assert!(e.to_string().contains("libcuda"), "{e}");
    }

    #[test]
    #[ignore = "needs a CUDA GPU"]
    fn allocates_zeroed_aligned_writable_memory() {
        for len in [0, 1, 4096, (1 << 20) + 3] {
            let mut buf = PinnedHost::alloc(len).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % ALIGN, 0);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
            buf.as_mut_slice().fill(7);
            let shared =
                std::thread::scope(|s| s.spawn(|| buf.as_slice().iter().all(|&b| b == 7)).join());
            assert!(shared.unwrap());
            // A fence with nothing queued is passed at once; fences can be set again and again.
            buf.wait_fence().unwrap();
            for _ in 0..3 {
                buf.fence().unwrap();
                buf.wait_fence().unwrap();
            }
        }
    }
}
