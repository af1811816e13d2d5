//! Run-time choice of instruction set for the decode loops, and the hand-written kernels of the fast
//! paths: this folder is where the crate allows `unsafe` (its call sites aside, each after the run-time
//! check).
//!
//! The row kernel is plain Rust written as fixed 16-lane chunks; compiled for baseline x86-64 it uses SSE2.
//! On CPUs with AVX2 the band decoders are compiled a second time with AVX2 enabled (`*_avx2` in
//! `v1/decode.rs` and `v1/region.rs`, same `#[inline(always)]` source), so the predictor runs on twice as
//! many lanes per instruction. The choice is made once per band, after the run-time checks below.
//!
//! The AVX2 copies also use the hand-written kernels of this folder, one file per stage, each tested
//! against its portable twin:
//! - `v1`: the v1 row decoder (`decode_row_avx2`; portable twin `v1/kernel.rs`);
//! - `interleave`: the RGB/RGBA interleavers (portable twins in `interleave.rs`);
//! - `v2`: the v2 rANS and BP decoders and row reconstruction (portable twins in `v2/`);
//! - `rans512`: the v2 rANS step on AVX-512 where the CPU has it and gathers fast (the rest of the AVX2
//!   chunk decoder unchanged; a test holds it to the portable and AVX2 decoders).
//!
//! The row and interleave kernels are `#[inline(always)] unsafe fn`s rather than `#[target_feature]` ones so
//! that they inline into the AVX2 band decoders (a call per row costs ~10 %); their contract is that the
//! CPU has AVX2. Inside, `unsafe` covers the intrinsics and unaligned loads and stores through pointers
//! taken from bounds-checked slices. Each has a test against the portable code.

#[cfg(target_arch = "x86_64")]
pub(crate) mod interleave;
#[cfg(target_arch = "x86_64")]
pub(crate) mod rans512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod v1;
#[cfg(target_arch = "x86_64")]
pub(crate) mod v2;

/// Whether this CPU can run the AVX2 copies (the answer is cached by `std`).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Whether this CPU can run the v2 AVX2 copies, which are also compiled for BMI2 (`shlx`, `tzcnt`) and
/// `popcnt`.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn has_avx2_bmi2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("bmi2")
        && std::arch::is_x86_feature_detected!("popcnt")
}

/// Whether the ANS decoder's table reads should use the hardware gather (`vpgatherdd`) rather than eight
/// scalar loads. The gather wins on Intel CPUs that do without the microcode fix for Gather Data Sampling
/// (Linux reports them "Not affected", or "Vulnerable" where the fix is off): +10–14 % ANS decode on a
/// Sapphire Rapids-class Xeon. With the fix (Skylake to Ice Lake servers) gathers run several times
/// slower, and on AMD Zen 1 and Zen 3 the scalar loads measured faster, so those keep them, as does any
/// CPU whose status cannot be read.
#[cfg(target_arch = "x86_64")]
pub(crate) fn fast_gather() -> bool {
    static FAST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAST.get_or_init(|| {
        let status =
            std::fs::read_to_string("/sys/devices/system/cpu/vulnerabilities/gather_data_sampling");
        cpu_vendor() == *b"GenuineIntel"
            && status.is_ok_and(|s| s.starts_with("Not affected") || s.starts_with("Vulnerable"))
    })
}

/// The CPU's vendor string (CPUID leaf 0: "GenuineIntel", "AuthenticAMD", ...).
#[cfg(target_arch = "x86_64")]
fn cpu_vendor() -> [u8; 12] {
    let id = std::arch::x86_64::__cpuid(0);
    let mut v = [0u8; 12];
    for (chunk, reg) in v.chunks_exact_mut(4).zip([id.ebx, id.edx, id.ecx]) {
        chunk.copy_from_slice(&reg.to_le_bytes());
    }
    v
}

/// Whether BMI2's `pdep` is a fast instruction here (Intel; AMD from Zen 3, family 19h) rather than
/// microcode (AMD before Zen 3: 15–100 ns a call on a Zen 1 EPYC). BP's group spread uses it where fast
/// (+3–6 % BP decode on a Sapphire Rapids-class Xeon over the shuffle-and-multiply form).
#[cfg(target_arch = "x86_64")]
pub(crate) fn fast_pdep() -> bool {
    static FAST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FAST.get_or_init(|| {
        let vendor = cpu_vendor();
        let eax = std::arch::x86_64::__cpuid(1).eax;
        let base = (eax >> 8) & 0xf;
        let family = if base == 0xf {
            base + ((eax >> 20) & 0xff)
        } else {
            base
        };
        has_avx2_bmi2()
            && (vendor == *b"GenuineIntel" || (vendor == *b"AuthenticAMD" && family >= 0x19))
    })
}
