//! pcr (work in progress).
