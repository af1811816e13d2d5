//! Files that must not lie: outputs appear complete or not at all, folders two processes could write are
//! locked, folder walks terminate, and opening a file never blocks.

#[allow(unsafe_code)]
mod atomic;
mod lock;
#[allow(unsafe_code)]
mod regular;
mod walk;

pub use atomic::{
    AtomicFile, TEMP_MARK, is_temp_name, process_alive, remove_stale_temps, remove_stale_temps_of,
    write_atomic,
};
pub use lock::{DirLock, LOCK_NAME};
pub use regular::{open_regular, read_regular};
pub use walk::{Skipped, Walk, walk};
