//! Batch memory: 64-byte-aligned host buffers recycled through a pool once the consumer drops a batch
//! (so a long run allocates nothing per batch and its memory stays flat), and the slots through which
//! several decode threads fill one buffer at once, each sample straight into its place.
//!
//! This module holds the loader's `unsafe` code: the aligned allocation, and handing out disjoint
//! mutable slots of one buffer to several threads.

use std::alloc::Layout as AllocLayout;
use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};

/// Alignment of every batch buffer: a cache line, more than any element type needs, and what DLPack
/// consumers prefer.
pub const ALIGN: usize = 64;

/// Where batch buffers come from: the heap, or page-locked memory the GPU copies from by DMA,
/// asynchronously (`pin_memory`), so that `tensor.cuda(non_blocking=True)` really overlaps.
#[derive(Clone)]
pub(crate) enum HostMemory {
    Pageable,
    #[cfg(feature = "gpu")]
    Pinned(std::sync::Arc<cuda_setup::cudarc::driver::CudaContext>),
}

impl HostMemory {
    /// Page-locked memory registered with CUDA device `ordinal`'s primary context (the one PyTorch,
    /// JAX and CuPy use), or the reason it cannot be had — never pageable memory in its place.
    pub fn pinned(ordinal: usize) -> Result<HostMemory, String> {
        #[cfg(feature = "gpu")]
        {
            cuda_setup::open(ordinal)
                .map(HostMemory::Pinned)
                .map_err(|e| e.to_string())
        }
        #[cfg(not(feature = "gpu"))]
        {
            let _ = ordinal;
            Err(crate::NO_GPU_FEATURE.into())
        }
    }
}

/// A zeroed block aligned to [`ALIGN`]: heap memory, or page-locked memory with the fence that says when
/// the GPU has finished reading it.
struct Block {
    ptr: NonNull<u8>,
    cap: usize,
    #[cfg(feature = "gpu")]
    pinned: Option<cuda_setup::PinnedHost>,
}

// SAFETY: a Block owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for Block {}
// SAFETY: a shared `&Block` gives out only its pointer and capacity; its bytes are written through
// `&mut` borrows, as a `Box<[u8]>`'s are, so sharing it is as safe as sharing a `&Box<[u8]>`.
unsafe impl Sync for Block {}

impl Block {
    fn new(cap: usize, memory: &HostMemory) -> Result<Block, String> {
        match memory {
            HostMemory::Pageable => {
                Block::heap(cap).ok_or_else(|| format!("out of memory allocating {cap} bytes"))
            }
            #[cfg(feature = "gpu")]
            HostMemory::Pinned(ctx) => {
                let mut p = cuda_setup::PinnedHost::alloc_in(ctx, cap)
                    .map_err(|e| format!("page-locking {cap} bytes: {e}"))?;
                let ptr = NonNull::new(p.as_mut_ptr()).ok_or("a null pinned pointer")?;
                Ok(Block {
                    ptr,
                    cap,
                    pinned: Some(p),
                })
            }
        }
    }

    fn heap(cap: usize) -> Option<Block> {
        if cap == 0 {
            // A dangling, aligned pointer is a valid empty slice.
            return Some(Block {
                ptr: NonNull::new(ALIGN as *mut u8)?,
                cap: 0,
                #[cfg(feature = "gpu")]
                pinned: None,
            });
        }
        let layout = AllocLayout::from_size_align(cap, ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size. Zeroed, so no byte is ever uninitialised.
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Block {
            ptr,
            cap,
            #[cfg(feature = "gpu")]
            pinned: None,
        })
    }

    /// Called when the consumer releases the block: for pinned memory, marks the work queued so far on
    /// the device's default stream (where a `non_blocking` copy out of the batch was queued), which must
    /// finish before the block is written again. `false` if that cannot be known: the block is then freed
    /// rather than reused.
    fn release(&mut self) -> bool {
        #[cfg(feature = "gpu")]
        if let Some(p) = &mut self.pinned {
            return p.fence().is_ok();
        }
        true
    }

    /// Called before the block is written again: waits for the work its last release marked.
    fn reuse(&self) -> Result<(), String> {
        #[cfg(feature = "gpu")]
        if let Some(p) = &self.pinned {
            return p
                .wait_fence()
                .map_err(|e| format!("waiting for the GPU to finish reading a pinned batch: {e}"));
        }
        Ok(())
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        #[cfg(feature = "gpu")]
        if self.pinned.is_some() {
            // PinnedHost frees itself.
            return;
        }
        if self.cap > 0 {
            let layout = AllocLayout::from_size_align(self.cap, ALIGN).expect("valid at creation");
            // SAFETY: allocated in `heap` with this very layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// Buffers of one capacity kept for reuse.
pub(crate) struct Pool {
    free: Mutex<Vec<Block>>,
    cap: usize,
    keep: usize,
    memory: HostMemory,
}

impl Pool {
    /// A pool of `cap`-byte buffers of `memory` that keeps at most `keep` idle ones.
    pub fn new(cap: usize, keep: usize, memory: HostMemory) -> Arc<Pool> {
        Arc::new(Pool {
            free: Mutex::new(Vec::new()),
            cap,
            keep,
            memory,
        })
    }

    /// A buffer of `len` bytes: a recycled one that holds them if any (once the GPU has finished
    /// reading it, for pinned memory), else a new one of the pool's capacity or `len` if that is more
    /// (whole-image batches differ in size: the pool keeps the larger blocks); the reason if none can be
    /// had.
    pub fn take(self: &Arc<Self>, len: usize) -> Result<HostBuffer, String> {
        let recycled = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let fits = free.iter().rposition(|b| b.cap >= len);
            fits.map(|i| free.swap_remove(i))
        };
        let block = match recycled {
            Some(b) => {
                b.reuse()?;
                b
            }
            None => Block::new(self.cap.max(len), &self.memory)?,
        };
        Ok(HostBuffer {
            block: Some(block),
            len,
            pool: Arc::downgrade(self),
        })
    }

    fn give(&self, mut block: Block) {
        if !block.release() {
            return;
        }
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        if block.cap < self.cap {
            return;
        }
        if free.len() < self.keep {
            free.push(block);
        } else if let Some(small) = free.iter_mut().min_by_key(|b| b.cap)
            && small.cap < block.cap
        {
            *small = block;
        }
    }

    /// Idle buffers held (for tests of the recycling).
    #[cfg(test)]
    pub fn idle(&self) -> usize {
        self.free.lock().unwrap().len()
    }
}

/// Host memory holding one batch's tensor, [`ALIGN`]-aligned. Dropping it returns the memory to the
/// loader's pool (or frees it once the loader is gone).
pub struct HostBuffer {
    block: Option<Block>,
    len: usize,
    pool: Weak<Pool>,
}

impl HostBuffer {
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory is page-locked (`pin_memory`).
    pub fn is_pinned(&self) -> bool {
        #[cfg(feature = "gpu")]
        return self.block.as_ref().is_some_and(|b| b.pinned.is_some());
        #[cfg(not(feature = "gpu"))]
        false
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.block
            .as_ref()
            .expect("present until drop")
            .ptr
            .as_ptr()
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the block holds at least `len` initialised (zeroed, then written) bytes, and `&self`
        // guarantees no slot or `&mut` is writing.
        unsafe { std::slice::from_raw_parts(self.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let ptr = self
            .block
            .as_ref()
            .expect("present until drop")
            .ptr
            .as_ptr();
        // SAFETY: as above, and `&mut self` is exclusive.
        unsafe { std::slice::from_raw_parts_mut(ptr, self.len) }
    }

    /// Keeps the first `len` bytes (after compacting a batch that lost items).
    pub(crate) fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let (Some(block), Some(pool)) = (self.block.take(), self.pool.upgrade()) {
            pool.give(block);
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.len)
    }
}

/// A batch buffer being filled by decode threads, one [`Slot`] each.
pub(crate) struct Filling {
    buf: UnsafeCell<HostBuffer>,
}

// SAFETY: the buffer is written only through Slots, which cover disjoint byte ranges and exist once each;
// it is read only after `finish` has proven (by unwrapping the Arc) that no Slot is left.
unsafe impl Sync for Filling {}

impl Filling {
    /// Splits `buf` into `n` slots of `slot_bytes` bytes (`n * slot_bytes <= buf.len()`).
    pub fn split(buf: HostBuffer, n: usize, slot_bytes: usize) -> (Arc<Filling>, Vec<Slot>) {
        assert!(n * slot_bytes <= buf.len(), "slots exceed the buffer");
        let base = buf.as_ptr() as *mut u8;
        let shared = Arc::new(Filling {
            buf: UnsafeCell::new(buf),
        });
        let slots = (0..n)
            .map(|i| Slot {
                _owner: shared.clone(),
                // SAFETY: in bounds, checked by the assert above.
                ptr: unsafe { base.add(i * slot_bytes) },
                len: slot_bytes,
            })
            .collect();
        (shared, slots)
    }

    /// The buffer, once every slot has been dropped; `Err` hands the Arc back if a slot still lives.
    pub fn finish(self: Arc<Self>) -> Result<HostBuffer, Arc<Self>> {
        Arc::try_unwrap(self).map(|f| f.buf.into_inner())
    }
}

/// One sample's bytes of a batch buffer, writable by the one thread that holds it.
pub(crate) struct Slot {
    _owner: Arc<Filling>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a Slot is the only handle to its byte range (disjoint from every other slot's), and it keeps
// the buffer alive; moving it to another thread moves that exclusive access.
unsafe impl Send for Slot {}

impl Slot {
    pub fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: see `unsafe impl Send for Slot`: exclusive, in bounds, initialised, alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_fill_one_buffer_from_many_threads_and_it_is_recycled() {
        let pool = Pool::new(4096, 2, HostMemory::Pageable);
        let buf = pool.take(4000).unwrap();
        assert_eq!(buf.as_ptr() as usize % ALIGN, 0);
        let (shared, slots) = Filling::split(buf, 10, 400);
        std::thread::scope(|s| {
            for (i, mut slot) in slots.into_iter().enumerate() {
                s.spawn(move || slot.bytes().fill(i as u8));
            }
        });
        let buf = shared.finish().ok().expect("no slot left");
        for (i, chunk) in buf.as_slice().chunks(400).enumerate() {
            assert!(chunk.iter().all(|&b| b == i as u8));
        }
        drop(buf);
        assert_eq!(pool.idle(), 1);
        let again = pool.take(10).unwrap();
        assert_eq!(pool.idle(), 0);
        assert_eq!(again.len(), 10);
        drop(pool);
        drop(again); // the pool is gone: freed, not leaked or panicking
    }

    #[test]
    fn buffers_of_varying_sizes_keep_the_larger_blocks() {
        // Whole-image batches: each its own size, above the pool's capacity.
        let pool = Pool::new(16, 2, HostMemory::Pageable);
        let (big, small) = (pool.take(1000).unwrap(), pool.take(100).unwrap());
        assert_eq!((big.len(), small.len()), (1000, 100));
        let big_at = big.as_ptr();
        drop((small, big));
        assert_eq!(pool.idle(), 2);
        let bigger = pool.take(2000).unwrap();
        assert_eq!(pool.idle(), 2, "nothing idle holds 2000 bytes: a new block");
        drop(bigger);
        assert_eq!(
            pool.idle(),
            2,
            "the pool keeps 2: the 2000 replaces the 100"
        );
        let mid = pool.take(900).unwrap();
        let again = pool.take(900).unwrap();
        assert!(mid.as_ptr() == big_at || again.as_ptr() == big_at);
        assert_eq!(pool.idle(), 0);
    }

    #[test]
    fn a_live_slot_keeps_the_buffer() {
        let pool = Pool::new(64, 1, HostMemory::Pageable);
        let (shared, mut slots) = Filling::split(pool.take(64).unwrap(), 2, 32);
        let last = slots.pop().unwrap();
        drop(slots);
        let shared = shared.finish().expect_err("a slot is alive");
        drop(last);
        assert!(shared.finish().is_ok());
    }
}
