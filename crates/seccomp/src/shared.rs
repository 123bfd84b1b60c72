//! The rules added to [`default_policy`](crate::default_policy) for
//! commands that share the namespaces of the processes around them (the
//! `landlock` backend: no namespace of their own). Where the `linux`
//! backend gives a command a network, IPC and mount namespace of its own,
//! these rules refuse what would reach through the shared ones.

use crate::policy::{Action, Condition, Policy, Rule, EPERM};

/// `AF_UNIX`.
pub const AF_UNIX: u64 = 1;
/// `AF_INET`.
pub const AF_INET: u64 = 2;
/// `AF_INET6`.
pub const AF_INET6: u64 = 10;
/// Every address family is below this (`AF_MAX` is 46 on Linux 6.18); the
/// families from here to 63 are refused too, and any value with a higher
/// bit set.
const FAMILY_BITS: u32 = 6;
/// The kernel reads `socket`'s arguments as 32-bit integers: a value is
/// compared on its low 32 bits, so that junk above them cannot make a
/// refused family look like another.
const LOW_32: u64 = 0xffff_ffff;

const IPC: &str = "System V IPC and POSIX message queues are the shared IPC namespace's: another process's shared memory, queues or semaphores could be reached";

/// What a command that shares the network namespace may open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedPolicy {
    /// Network sockets (`AF_INET`, `AF_INET6`) are allowed: the sandbox's
    /// network is the host's (`--net host`). Without it no socket but a
    /// unix one may be made (`--net none`).
    pub network: bool,
    /// `socket(AF_UNIX, ...)` is allowed: only where Landlock confines
    /// connecting to a socket file by its path (ABI 9), else a command
    /// could connect to any socket of the host it can name (a mounted
    /// `docker.sock`). `socketpair` stays allowed either way.
    pub unix_sockets: bool,
}

/// The policy [`SharedPolicy`] describes, installed on top of
/// [`default_policy`](crate::default_policy) (filters stack; the stricter
/// answer wins): sockets of the families it does not allow, and System V
/// IPC and POSIX message queues, refused with `EPERM`; everything else
/// allowed.
pub fn shared_namespace_policy(policy: SharedPolicy) -> Policy {
    const UNIX: &str = "a unix socket could connect to any socket file of the host it can name (Landlock confines that only from ABI 9); socketpair stays allowed";
    const NO_NETWORK: &str = "--net none: the sandbox shares the host's network namespace, so no socket but a unix one may be made";
    let mut rules = Vec::new();
    for family in 0..(1u64 << FAMILY_BITS) {
        let (allowed, reason) = match family {
            AF_UNIX => (policy.unix_sockets, UNIX),
            _ => (policy.network, NO_NETWORK),
        };
        if !allowed {
            rules.push(
                Rule::errno("socket", EPERM, reason).when(Condition::masked_eq(0, LOW_32, family)),
            );
        }
    }
    if !policy.network {
        // A family of 64 or more: not one the kernel has, refused whatever
        // it is (the kernel reads the low 32 bits).
        for bit in FAMILY_BITS..32 {
            rules.push(
                Rule::errno("socket", EPERM, NO_NETWORK).when(Condition::has_bits(0, 1u64 << bit)),
            );
        }
    }
    for name in [
        "shmget",
        "shmat",
        "shmdt",
        "shmctl",
        "msgget",
        "msgsnd",
        "msgrcv",
        "msgctl",
        "semget",
        "semop",
        "semtimedop",
        "semctl",
        "mq_open",
        "mq_unlink",
        "mq_timedsend",
        "mq_timedreceive",
        "mq_notify",
        "mq_getsetattr",
    ] {
        rules.push(Rule::errno(name, EPERM, IPC));
    }
    Policy {
        default: Action::Allow,
        rules,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn socket(family: u64, ty: u64) -> [u64; 6] {
        [family, ty, 0, 0, 0, 0]
    }

    #[test]
    fn net_none_leaves_only_unix_sockets_and_only_where_landlock_confines_them() {
        let none = shared_namespace_policy(SharedPolicy {
            network: false,
            unix_sockets: true,
        });
        none.validate().unwrap();
        assert_eq!(
            none.action_for("socket", &socket(AF_UNIX, 1)),
            Action::Allow
        );
        for family in [AF_INET, AF_INET6, 16, 17, 40, 45, 63, 64, 1 << 20] {
            assert_eq!(
                none.action_for("socket", &socket(family, 1)),
                Action::Errno(EPERM),
                "family {family}"
            );
        }
        // Junk above the 32 bits the kernel reads changes nothing.
        assert_eq!(
            none.action_for("socket", &socket((1 << 32) | AF_INET, 1)),
            Action::Errno(EPERM)
        );
        let no_unix = shared_namespace_policy(SharedPolicy {
            network: false,
            unix_sockets: false,
        });
        assert_eq!(
            no_unix.action_for("socket", &socket(AF_UNIX, 1)),
            Action::Errno(EPERM)
        );
        assert_eq!(
            no_unix.action_for("socketpair", &socket(AF_UNIX, 1)),
            Action::Allow
        );
    }

    #[test]
    fn net_host_allows_every_network_family_but_not_unix_sockets_below_abi_9() {
        let host = shared_namespace_policy(SharedPolicy {
            network: true,
            unix_sockets: false,
        });
        for family in [AF_INET, AF_INET6, 16, 17] {
            assert_eq!(host.action_for("socket", &socket(family, 2)), Action::Allow);
        }
        assert_eq!(
            host.action_for("socket", &socket(AF_UNIX, 1)),
            Action::Errno(EPERM)
        );
    }

    #[test]
    fn shared_ipc_is_refused_whatever_the_network() {
        for network in [false, true] {
            let p = shared_namespace_policy(SharedPolicy {
                network,
                unix_sockets: true,
            });
            for call in ["shmget", "shmat", "msgget", "semget", "mq_open"] {
                assert_eq!(p.action_for(call, &[0; 6]), Action::Errno(EPERM), "{call}");
            }
            let program = crate::compile(&p).unwrap();
            assert!(!program.instructions().is_empty());
        }
    }
}
