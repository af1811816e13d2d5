//! A memory limit to check big allocations against *before* making them: an absurd batch size or image
//! size must be a clear error, not an abort from the allocator after gigabytes have been asked for.
//!
//! The limit is `L3_MEMORY_LIMIT` (bytes, or with a K/M/G/T suffix, powers of 1024) when set, else the
//! smallest of the machine's physical memory, the cgroup's `memory.max` and `RLIMIT_AS`.

use std::fmt;

/// The environment variable that overrides the detected limit.
pub const LIMIT_VAR: &str = "L3_MEMORY_LIMIT";

/// An allocation that would not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooLarge {
    /// What needed the memory ("batch buffers", "decoded image").
    pub what: String,
    pub needed: u64,
    pub limit: u64,
    /// Where the limit came from.
    pub source: &'static str,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} need {} but the memory limit is {} ({}; set {LIMIT_VAR} to change it)",
            self.what,
            human(self.needed),
            human(self.limit),
            self.source
        )
    }
}

impl std::error::Error for TooLarge {}

/// `bytes` in the largest binary unit that keeps it above 1 (`1.5 GiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Parses `123`, `64K`, `1.5G`, ... (powers of 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, c) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                _ => return None,
            };
            (&s[..i], (1u64 << shift) as f64)
        }
        _ => (s, 1.0),
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then_some((v * mul) as u64)
}

/// The memory limit in bytes and where it came from.
pub fn limit() -> (u64, &'static str) {
    if let Some(v) = std::env::var(LIMIT_VAR).ok().and_then(|s| parse_size(&s)) {
        return (v, LIMIT_VAR);
    }
    let mut best = (u64::MAX, "no limit found");
    let mut consider = |v: Option<u64>, src: &'static str| {
        if let Some(v) = v
            && v < best.0
        {
            best = (v, src);
        }
    };
    consider(physical(), "physical memory");
    consider(cgroup(), "cgroup memory.max");
    consider(rlimit_as(), "RLIMIT_AS");
    best
}

/// Fails if `needed` bytes exceed the [`limit`].
pub fn check(needed: u64, what: impl Into<String>) -> Result<(), TooLarge> {
    let (limit, source) = limit();
    if needed > limit {
        return Err(TooLarge {
            what: what.into(),
            needed,
            limit,
            source,
        });
    }
    Ok(())
}

fn physical() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn cgroup() -> Option<u64> {
    let text = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?;
    text.trim().parse().ok()
}

fn rlimit_as() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes a plain struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) };
    (rc == 0 && r.rlim_cur != libc::RLIM_INFINITY).then_some(r.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("1.5g"), Some(3 << 29));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size("-1"), None);
        assert_eq!(human(512), "512 bytes");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }

    #[test]
    fn absurd_requests_fail_with_the_numbers() {
        let (limit, _) = limit();
        assert!(limit > 0);
        let e = check(u64::MAX, "batch buffers").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("batch buffers need 16.0 EiB but the memory limit is "),
            "{msg}"
        );
        check(1024, "a little").unwrap();
    }
}
