//! The simulator's self-checks: a correct kernel over a 2-D grid with partial warps runs every thread once,
//! and kernels that are wrong on purpose are caught (a race by ThreadSanitizer, an overflow of a fiber's
//! frame by AddressSanitizer, a divergent barrier by the scheduler). Needs a C++20 compiler (`c++`, or
//! `$CXX`); without one (or without a sanitizer runtime) a test prints why and skips.

use cuda_sim::{Error, Flavour, Harness};
use std::process::{Command, Output};

static PROBES: Harness = Harness::new("probes", include_str!("../cpp/probes.cpp"), &[], &[]);

fn probe(flavour: Flavour, name: &str) -> Option<Output> {
    match PROBES.get(flavour) {
        Ok(exe) => Some(
            Command::new(exe)
                .arg(name)
                .env("TSAN_OPTIONS", "halt_on_error=1 exitcode=66")
                .output()
                .unwrap(),
        ),
        Err(Error::Unavailable(why)) => {
            eprintln!("skipping: {why}");
            None
        }
        Err(e @ Error::Source(_)) => panic!("{e}"),
    }
}

#[test]
fn every_thread_of_a_2d_grid_with_partial_warps_runs_once() {
    for flavour in [Flavour::Plain, Flavour::Asan, Flavour::Tsan] {
        let Some(out) = probe(flavour, "indices") else {
            continue;
        };
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{flavour:?}: {log}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "every thread ran once\n"
        );
    }
}

/// `__byte_perm(x, y, s)`: byte k of the result is byte `(s >> 4k) & 7` of y:x, as CUDA defines it.
#[test]
fn byte_perm_selects_bytes_as_cuda_does() {
    let Some(out) = probe(Flavour::Plain, "byte_perm") else {
        return;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "55443322 66442200 77661100 00112233 44444444 \n"
    );
}

/// The blocks of a launch run in the order `CUDA_SIM_BLOCK_ORDER` names: forward, reverse, or a
/// shuffle that a seed replays and another seed changes; [`cuda_sim::run`] gives every tag its own.
#[test]
fn blocks_run_in_the_order_asked() {
    let Ok(exe) = PROBES.get(Flavour::Plain) else {
        let _ = probe(Flavour::Plain, "order"); // prints why, or fails on a source error
        return;
    };
    let ran = |order: &str| -> Vec<u32> {
        let out = Command::new(exe)
            .arg("order")
            .env("CUDA_SIM_BLOCK_ORDER", order)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(|b| b.parse().unwrap())
            .collect()
    };
    assert_eq!(ran("forward"), (0..8).collect::<Vec<_>>());
    assert_eq!(ran("reverse"), (0..8).rev().collect::<Vec<_>>());
    let (a, b) = (ran("12345"), ran("54321"));
    assert_eq!(a, ran("12345"), "a seed replays its shuffle");
    for s in [&a, &b] {
        let mut sorted = s.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..8).collect::<Vec<_>>(),
            "every block once: {s:?}"
        );
    }
    assert_ne!(a, b, "two seeds, one order");
    assert_ne!(a, (0..8).collect::<Vec<_>>());
    assert_ne!(cuda_sim::block_order("a"), cuda_sim::block_order("b"));
}

/// The simulated threads are fibers whose switches order nothing; only barriers do. A probe kernel that
/// reads shared memory another warp wrote, with only warp barriers between, shows that a race the
/// kernel's barriers do not order is still reported.
#[test]
fn thread_sanitizer_reports_a_race_across_warps() {
    let Some(out) = probe(Flavour::Tsan, "race") else {
        return;
    };
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(66),
        "ThreadSanitizer missed the race:\n{log}"
    );
    assert!(log.contains("data race"), "{log}");
}

/// The simulated threads are fibers on stacks of the simulator's own: a probe kernel that reads past a
/// local array after a barrier shows that AddressSanitizer still sees such frames' bounds.
#[test]
fn address_sanitizer_sees_overflows_in_fiber_frames() {
    let Some(out) = probe(Flavour::Asan, "overflow") else {
        return;
    };
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && log.contains("stack-buffer-overflow"),
        "AddressSanitizer missed the overflow ({}):\n{log}",
        out.status
    );
}

/// A `__syncthreads` that not every thread of the block reaches (on a GPU: a hang or undefined behaviour)
/// is reported instead of waited on forever.
#[test]
fn a_divergent_barrier_is_reported() {
    let Some(out) = probe(Flavour::Plain, "divergent") else {
        return;
    };
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{log}");
    assert!(log.contains("threads 0..=31 at __syncthreads"), "{log}");
}

#[test]
fn a_compile_error_in_our_sources_is_a_source_error() {
    static BROKEN: Harness = Harness::new(
        "broken",
        "#include \"kernels.cu\"\nint main() { return 0; }\n",
        &[("kernels.cu", "this is not C++")],
        &[],
    );
    match BROKEN.get(Flavour::Plain) {
        Err(Error::Source(log)) => assert!(log.contains("kernels.cu"), "{log}"),
        Err(Error::Unavailable(why)) => eprintln!("skipping: {why}"),
        Ok(_) => panic!("built a broken harness"),
    }
}
