//! A child made by `fork` after the parent's worker threads were parked (Python's multiprocessing, a
//! PyTorch DataLoader's workers) inherits the list of parked helpers but not their threads: its own
//! parallel calls must start threads of its own, not wait forever for the parent's.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

fn sum_on(threads: usize) -> usize {
    let total = AtomicUsize::new(0);
    stdx::parallel::for_each(0..64usize, threads, |i| {
        total.fetch_add(i, Ordering::Relaxed);
        Ok::<(), ()>(())
    })
    .unwrap();
    total.into_inner()
}

#[test]
fn a_forked_child_starts_its_own_workers() {
    // Parks helpers in this process.
    assert_eq!(sum_on(4), 2016);
    // SAFETY: the child only runs the pool (its own threads) and leaves with _exit, touching nothing the
    // test harness's other threads might hold.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = if sum_on(4) == 2016 { 0 } else { 1 };
        // SAFETY: ends the child at once, without the parent's atexit handlers or test harness.
        unsafe { libc::_exit(code) };
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child, without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: the child is ours.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the forked child's parallel call did not finish in 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status}"
    );
    // The parent's helpers still serve it.
    assert_eq!(sum_on(4), 2016);
}
