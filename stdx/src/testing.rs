//! The one rule for a test that cannot run here (no Python with onnx, no conformance vectors, no
//! sanitizer runtime, a file system where the page cache cannot be measured): on a developer's machine it
//! says why and returns; under CI (`CI=true`, which CI services set and `.ci/run` exports) it fails with
//! that reason, so that a CI run never counts a test that did not run as passed. Tests that need a GPU are
//! `#[ignore]`d instead, and are not this rule's business.

/// The variable that makes every [`skip`] a failure, and the value it must have.
pub const REQUIRE_ALL_VAR: (&str, &str) = ("CI", "true");

/// Whether every test must run (`CI=true`).
pub fn all_tests_required() -> bool {
    std::env::var(REQUIRE_ALL_VAR.0).is_ok_and(|v| v == REQUIRE_ALL_VAR.1)
}

/// Reports that the calling test cannot run here, for `reason`: prints `skipped: reason` (the caller then
/// returns), or, under CI, panics with it.
#[track_caller]
pub fn skip(reason: impl std::fmt::Display) {
    if all_tests_required() {
        panic!("this test cannot run here, and CI=true requires every test to run: {reason}");
    }
    eprintln!("skipped: {reason}");
}
