//! Dense f32 activations of one image: the `C×H×W` part of an NCHW tensor (N = 1: the tiling engine runs
//! one image at a time, and a batch is a loop).

use crate::error::{Error, Result};

/// A `C×H×W` block of f32, row-major within each channel plane.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tensor {
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub data: Vec<f32>,
}

/// `c · h · w`, or [`Error::OutOfMemory`] where the product does not fit in a `usize`.
fn elements(c: usize, h: usize, w: usize) -> Result<usize> {
    c.checked_mul(h)
        .and_then(|n| n.checked_mul(w))
        .ok_or(Error::OutOfMemory { bytes: u64::MAX })
}

impl Tensor {
    /// A zeroed `c × h × w` tensor; [`Error::OutOfMemory`] when it cannot be allocated (or its size
    /// does not fit in memory at all).
    pub fn zeros(c: usize, h: usize, w: usize) -> Result<Tensor> {
        Ok(Tensor {
            c,
            h,
            w,
            data: crate::buffers::zeros(elements(c, h, w)?)?,
        })
    }

    /// A `c × h × w` tensor for a caller that writes every element before reading any (its values are
    /// left from a buffer's earlier use: [`crate::buffers::scratch`]).
    pub(crate) fn scratch(c: usize, h: usize, w: usize) -> Result<Tensor> {
        Ok(Tensor {
            c,
            h,
            w,
            data: crate::buffers::scratch(elements(c, h, w)?)?,
        })
    }

    pub fn from_vec(c: usize, h: usize, w: usize, data: Vec<f32>) -> Result<Tensor> {
        if data.len() != c * h * w {
            return Err(Error::TensorShape {
                len: data.len(),
                shape: [c, h, w],
            });
        }
        Ok(Tensor { c, h, w, data })
    }

    pub fn plane(&self, c: usize) -> &[f32] {
        &self.data[c * self.h * self.w..(c + 1) * self.h * self.w]
    }

    pub fn at(&self, c: usize, y: usize, x: usize) -> f32 {
        self.data[(c * self.h + y) * self.w + x]
    }

    /// Rows `y0..y1`, columns `x0..x1` of every channel, copied out.
    pub fn crop(&self, y0: usize, y1: usize, x0: usize, x1: usize) -> Tensor {
        let (h, w) = (y1 - y0, x1 - x0);
        let mut out = Vec::with_capacity(self.c * h * w);
        for c in 0..self.c {
            let p = self.plane(c);
            for y in y0..y1 {
                out.extend_from_slice(&p[y * self.w + x0..y * self.w + x1]);
            }
        }
        Tensor {
            c: self.c,
            h,
            w,
            data: out,
        }
    }

    /// Writes `src` with its top-left corner at `(y0, x0)`, clipping what falls outside.
    pub fn paste(&mut self, y0: usize, x0: usize, src: &Tensor) {
        let h = src.h.min(self.h.saturating_sub(y0));
        let w = src.w.min(self.w.saturating_sub(x0));
        for c in 0..self.c.min(src.c) {
            for y in 0..h {
                let d = (c * self.h + y0 + y) * self.w + x0;
                let s = (c * src.h + y) * src.w;
                self.data[d..d + w].copy_from_slice(&src.data[s..s + w]);
            }
        }
    }

    /// Bytes of f32 data a tensor of this shape holds.
    pub fn bytes(c: usize, h: usize, w: usize) -> u64 {
        (c * h * w * std::mem::size_of::<f32>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape whose element count overflows is refused as out of memory, not wrapped or aborted.
    #[test]
    fn an_impossible_shape_is_an_error() {
        for (c, h, w) in [(usize::MAX, 2, 2), (1 << 40, 1 << 40, 1)] {
            assert!(matches!(
                Tensor::zeros(c, h, w),
                Err(Error::OutOfMemory { bytes: u64::MAX })
            ));
            assert!(Tensor::scratch(c, h, w).is_err());
        }
        assert_eq!(Tensor::zeros(2, 3, 4).unwrap().data, vec![0.0; 24]);
    }
}
