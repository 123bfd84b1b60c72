use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How strongly a backend separates the code it runs from the host.
///
/// Ordered weakest to strongest, so that policy can say
/// `actual >= Isolation::Kernel`. The order is part of the contract: never
/// reorder the variants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Isolation {
    /// A child process on the host, confined only by the file fence.
    /// For trusted code only.
    None,
    /// Namespaces, seccomp, Landlock or a container: a separate view of the
    /// system on the shared host kernel. A kernel exploit escapes.
    Process,
    /// A user-space application kernel (gVisor) between the code and the
    /// host kernel.
    Kernel,
    /// A hardware-virtualised machine with its own kernel.
    Vm,
}

impl Isolation {
    /// Every level, weakest first.
    pub const ALL: [Isolation; 4] = [
        Isolation::None,
        Isolation::Process,
        Isolation::Kernel,
        Isolation::Vm,
    ];

    /// The lowercase name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::Process => "process",
            Isolation::Kernel => "kernel",
            Isolation::Vm => "vm",
        }
    }
}

impl fmt::Display for Isolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An isolation name that is not one of `none`, `process`, `kernel`, `vm`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown isolation level {0:?}; expected one of none, process, kernel, vm")]
pub struct ParseIsolationError(pub String);

impl FromStr for Isolation {
    type Err = ParseIsolationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Isolation::ALL
            .into_iter()
            .find(|level| level.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| ParseIsolationError(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_ordered_weakest_to_strongest() {
        assert!(Isolation::None < Isolation::Process);
        assert!(Isolation::Process < Isolation::Kernel);
        assert!(Isolation::Kernel < Isolation::Vm);
    }

    #[test]
    fn names_round_trip() {
        for level in Isolation::ALL {
            assert_eq!(level.as_str().parse::<Isolation>(), Ok(level));
        }
        assert!("VM".parse::<Isolation>().is_ok());
        assert!("strong".parse::<Isolation>().is_err());
    }
}
