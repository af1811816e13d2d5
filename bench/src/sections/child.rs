//! The child-process protocol of the sections that measure every run in its own process (so that its
//! peak RSS is its own): the parent re-executes this binary with a spec in an environment variable, and
//! the child prints one line `TAG key=value ...`.

use std::collections::HashMap;

/// In a child (`var` set): runs `child` on its spec and exits — 0, or 1 after printing the error.
pub fn run_if_child(var: &str, name: &str, child: impl FnOnce(&str) -> anyhow::Result<()>) {
    if let Ok(spec) = std::env::var(var) {
        match child(&spec) {
            Ok(()) => std::process::exit(0),
            Err(e) => {
                eprintln!("{name} child: {e:#}");
                std::process::exit(1);
            }
        }
    }
}

/// The `key=value` pairs of the line starting with `tag` in a process's stdout, or why there is none: its
/// stderr's last line, or the line's own `error=` (underscores for spaces).
pub fn line_of(o: &std::process::Output, tag: &str) -> Result<HashMap<String, String>, String> {
    let stdout = String::from_utf8_lossy(&o.stdout);
    let Some(line) = stdout.lines().find(|l| l.starts_with(tag)) else {
        let err = String::from_utf8_lossy(&o.stderr);
        return Err(err
            .lines()
            .last()
            .unwrap_or("the process printed nothing")
            .to_string());
    };
    let kv: HashMap<String, String> = line[tag.len()..]
        .split(' ')
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    match kv.get("error") {
        Some(e) => Err(e.replace('_', " ")),
        None => Ok(kv),
    }
}

/// The number at `key`, NaN when it is missing or not a number.
pub fn num(kv: &HashMap<String, String>, key: &str) -> f64 {
    kv.get(key).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}
