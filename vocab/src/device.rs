//! Where work runs: the CPU or one CUDA device.

use crate::Invalid;

/// Where items are decoded or a network runs. One spelling on every surface: `cpu`, `cuda` (device 0) or
/// `cuda:N`; `Display` writes `cpu` or `cuda:N`, which parses back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Device {
    /// The CPU threads.
    #[default]
    Cpu,
    /// CUDA device `ordinal`.
    Cuda(usize),
}

impl Device {
    pub fn is_cuda(self) -> bool {
        matches!(self, Device::Cuda(_))
    }
}

impl std::fmt::Display for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl std::str::FromStr for Device {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Device, Invalid> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| Invalid::new("device", s, "cpu, cuda or cuda:N")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_spelling_round_trips() {
        for (s, d) in [
            ("cpu", Device::Cpu),
            ("cuda", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
        ] {
            assert_eq!(s.parse::<Device>(), Ok(d));
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        for bad in ["gpu", "cuda:", "cuda:-1", "cuda:+1", "CPU", "cuda:x"] {
            let e = bad.parse::<Device>().unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("device {bad:?}: expected cpu, cuda or cuda:N")
            );
        }
    }
}
