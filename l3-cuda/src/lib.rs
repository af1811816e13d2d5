//! l3-cuda (work in progress).
