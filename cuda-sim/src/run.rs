//! One run of a harness: the input written to a file beside it, `harness IN OUT ARGS...`, the output file
//! read back.

use std::path::Path;
use std::process::Command;

/// Runs `exe` on `input` (written to a file named after `tag` and the calling thread, so that tests may
/// run in parallel) with `args` after the input and output paths, and returns the output file's bytes; a
/// failed run is `Err` with its exit status and standard error (a sanitizer's report, the scheduler's
/// deadlock report). ThreadSanitizer stops at its first report, with exit code 66.
///
/// The blocks of every launch run in an order shuffled by a hash of `tag` ([`block_order`]): a GPU
/// promises no order, so a kernel whose output depends on it fails here, reproducibly.
pub fn run(exe: &Path, tag: &str, input: &[u8], args: &[&str]) -> Result<Vec<u8>, String> {
    run_in_order(exe, tag, input, args, &block_order(tag))
}

/// The block order [`run`] gives the harness of a launch tagged `tag`: `CUDA_SIM_BLOCK_ORDER` when this
/// process has it (`forward`, `reverse` or a shuffle's seed, to replay or vary a run), else a shuffle
/// seeded by the tag's FNV-1a hash.
pub fn block_order(tag: &str) -> String {
    std::env::var("CUDA_SIM_BLOCK_ORDER").unwrap_or_else(|_| {
        let hash = tag.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        hash.to_string()
    })
}

/// [`run`] with the blocks of every launch in `order`: `forward`, `reverse`, or a decimal seed of a
/// shuffle (the harness reads it as `CUDA_SIM_BLOCK_ORDER`).
pub fn run_in_order(
    exe: &Path,
    tag: &str,
    input: &[u8],
    args: &[&str],
    order: &str,
) -> Result<Vec<u8>, String> {
    let dir = exe.parent().unwrap_or(Path::new("."));
    let tid =
        format!("{:?}", std::thread::current().id()).replace(|c: char| !c.is_alphanumeric(), "");
    let in_path = dir.join(format!("{tag}-{tid}.in"));
    let out_path = dir.join(format!("{tag}-{tid}.out"));
    std::fs::write(&in_path, input).map_err(|e| format!("writing {}: {e}", in_path.display()))?;
    let res = Command::new(exe)
        .arg(&in_path)
        .arg(&out_path)
        .args(args)
        .env("TSAN_OPTIONS", "halt_on_error=1 exitcode=66")
        .env("CUDA_SIM_BLOCK_ORDER", order)
        .output()
        .map_err(|e| format!("running {}: {e}", exe.display()));
    let _ = std::fs::remove_file(&in_path);
    let res = res?;
    if !res.status.success() {
        let _ = std::fs::remove_file(&out_path);
        return Err(format!(
            "{tag}: simulated kernels failed ({}):\n{}",
            res.status,
            String::from_utf8_lossy(&res.stderr)
        ));
    }
    let bytes =
        std::fs::read(&out_path).map_err(|e| format!("reading {}: {e}", out_path.display()));
    let _ = std::fs::remove_file(&out_path);
    bytes
}
