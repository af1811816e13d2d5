//! liquid-sampler (work in progress).
