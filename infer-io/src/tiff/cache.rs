//! Decoded chunks kept for the windows that follow: neighbouring tiles' windows overlap (the halo) and a
//! strip spans every tile of a row, so a chunk is decoded once per pass instead of once per window. The
//! cache holds at most a given number of bytes and drops the least recently used chunk first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A decoded chunk: its samples in the file's type and the width of its rows (in pixels).
pub struct Chunk {
    pub samples: Samples,
    pub width: usize,
}

/// A chunk's samples, row after row, interleaved when the file is chunky.
pub enum Samples {
    U8(Vec<u8>),
    U16(Vec<u16>),
    F32(Vec<f32>),
}

impl Samples {
    pub fn len(&self) -> usize {
        match self {
            Samples::U8(v) => v.len(),
            Samples::U16(v) => v.len(),
            Samples::F32(v) => v.len(),
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Samples::U8(v) => v.len(),
            Samples::U16(v) => v.len() * 2,
            Samples::F32(v) => v.len() * 4,
        }
    }

    /// Sample `i` as a float: integers widen exactly, floats are taken as they are.
    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        match self {
            Samples::U8(v) => f32::from(v[i]),
            Samples::U16(v) => f32::from(v[i]),
            Samples::F32(v) => v[i],
        }
    }
}

pub struct ChunkCache {
    capacity: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    chunks: HashMap<u32, (Arc<Chunk>, u64)>,
    bytes: usize,
    clock: u64,
}

impl ChunkCache {
    pub fn new(capacity: usize) -> ChunkCache {
        ChunkCache {
            capacity,
            inner: Mutex::new(Inner::default()),
        }
    }

    pub fn get(&self, index: u32) -> Option<Arc<Chunk>> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clock += 1;
        let now = g.clock;
        g.chunks.get_mut(&index).map(|(c, used)| {
            *used = now;
            c.clone()
        })
    }

    /// Keeps `chunk`, dropping the least recently used ones beyond the capacity. A chunk larger than the
    /// whole capacity is not kept (its caller holds it for the window at hand).
    pub fn put(&self, index: u32, chunk: Arc<Chunk>) {
        let size = chunk.samples.bytes();
        if size > self.capacity {
            return;
        }
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.clock += 1;
        let now = g.clock;
        if let Some((old, _)) = g.chunks.insert(index, (chunk, now)) {
            g.bytes -= old.samples.bytes();
        }
        g.bytes += size;
        while g.bytes > self.capacity {
            let Some((&victim, _)) = g.chunks.iter().min_by_key(|(_, (_, used))| *used) else {
                break;
            };
            if let Some((old, _)) = g.chunks.remove(&victim) {
                g.bytes -= old.samples.bytes();
            }
        }
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(n: usize) -> Arc<Chunk> {
        Arc::new(Chunk {
            samples: Samples::U8(vec![0; n]),
            width: n,
        })
    }

    #[test]
    fn bounded_and_least_recently_used_first() {
        let c = ChunkCache::new(100);
        c.put(1, chunk(40));
        c.put(2, chunk(40));
        assert!(c.get(1).is_some()); // 2 is now the oldest
        c.put(3, chunk(40));
        assert!(c.bytes() <= 100);
        assert!(c.get(2).is_none());
        assert!(c.get(1).is_some() && c.get(3).is_some());
        c.put(4, chunk(101)); // larger than the capacity: not kept
        assert!(c.get(4).is_none());
        assert_eq!(c.bytes(), 80);
    }
}
