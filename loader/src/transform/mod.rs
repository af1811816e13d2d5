//! Resampling a sample out of its image on the CPU: the passes ([`resample`]) that apply a
//! [`Resampling`]'s host-computed integer tables (`vocab`, shared with the GPU kernel) to the window plus
//! the filter's margin.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;
pub mod resample;

use resample::{Buffers, Source};
use vocab::Resampling;

/// The kept outputs of `src` resampled by `plan`, packed and interleaved. `false` if `src` does not hold
/// [`Resampling::source`].
pub fn apply(plan: &Resampling, src: &Source<u8>, buf: &mut Buffers, out: &mut Vec<u8>) -> bool {
    match plan {
        Resampling::Bilinear { x, y } => resample::bilinear(src, x, y, buf, out),
        Resampling::Nearest { x, y } => resample::nearest(src, x, y, out),
    }
}
