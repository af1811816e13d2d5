//! bsp-tiling (work in progress).
