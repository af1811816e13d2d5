//! l3-format (work in progress).
