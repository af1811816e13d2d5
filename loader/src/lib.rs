//! The thin stitching crate: datasets, decode pools and batches over the toolkit's formats.
//!
//! The `l3` command-line tool lives in `src/bin/l3/`, one module per subcommand group.
