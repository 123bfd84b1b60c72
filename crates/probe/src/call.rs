//! Making one check's call, and reading its outcome: what it returned, the
//! errno and its name, and what the policy would have answered.

use hako_seccomp::{Action, Arch, Policy, ADDR_NO_RANDOMIZE, PERSONALITY_QUERY};
use hako_sys::raw::{syscall_ints, SyscallError};
use serde_json::{json, Map, Value};

use crate::table::{Check, How};

/// The outcome of one raw call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It returned this value.
    Ret(i64),
    /// It failed with this errno.
    Errno(i32),
    /// `hako_sys::raw::syscall_ints` declined it (a bug in the probe).
    NotMade(&'static str),
    /// The system call does not exist on this architecture.
    NoSuchCall,
}

impl Outcome {
    fn from_result(result: Result<i64, SyscallError>) -> Self {
        match result {
            Ok(ret) => Outcome::Ret(ret),
            Err(SyscallError::Errno(errno)) => Outcome::Errno(errno),
            Err(SyscallError::NotSound(why)) => Outcome::NotMade(why),
        }
    }

    pub(crate) fn to_json(self) -> Map<String, Value> {
        let mut map = Map::new();
        let (ret, errno) = match self {
            Outcome::Ret(ret) => (json!(ret), Value::Null),
            Outcome::Errno(errno) => (Value::Null, json!(errno)),
            Outcome::NotMade(why) => {
                map.insert("not_made".into(), json!(why));
                (Value::Null, Value::Null)
            }
            Outcome::NoSuchCall => {
                map.insert("not_made".into(), json!("no such system call here"));
                (Value::Null, Value::Null)
            }
        };
        map.insert("ret".into(), ret);
        map.insert("errno".into(), errno);
        let error = match self {
            Outcome::Errno(errno) => json!(errno_name(errno)),
            _ => Value::Null,
        };
        map.insert("error".into(), error);
        map
    }
}

/// Makes system call `nr` (`None`: it does not exist here) with `args`.
pub(crate) fn raw(nr: Option<i64>, args: [u64; 6]) -> Outcome {
    match nr {
        Some(nr) => Outcome::from_result(syscall_ints(nr, args)),
        None => Outcome::NoSuchCall,
    }
}

/// Runs one check and returns its outcome and the arguments actually used.
pub fn run_check(arch: Arch, check: &Check) -> (Outcome, [u64; 6]) {
    let nr = arch.syscall_number(check.syscall);
    match check.how {
        How::Plain => (raw(nr, check.args), check.args),
        How::X32 => (
            raw(nr.map(|nr| nr | hako_sys::raw::X32_SYSCALL_BIT), check.args),
            check.args,
        ),
        How::PersonalitySetAndRestore => {
            let current = match raw(nr, [PERSONALITY_QUERY, 0, 0, 0, 0, 0]) {
                Outcome::Ret(p) => p as u64 & 0xffff_ffff,
                other => return (other, check.args),
            };
            let args = [current | ADDR_NO_RANDOMIZE, 0, 0, 0, 0, 0];
            let outcome = raw(nr, args);
            if let Outcome::Ret(_) = outcome {
                // Allowed: put the persona back before anything is executed.
                let _ = raw(nr, [current, 0, 0, 0, 0, 0]);
            }
            (outcome, args)
        }
    }
}

/// The errno the policy answers a check with (`None`: allowed).
pub fn policy_errno(policy: &Policy, check: &Check, args: &[u64; 6]) -> Option<i32> {
    if check.how == How::X32 {
        return Some(libc::ENOSYS);
    }
    match policy.action_for(check.syscall, args) {
        Action::Allow => None,
        Action::Errno(errno) => Some(errno),
    }
}

/// The symbolic name of an errno the probe may see.
pub fn errno_name(errno: i32) -> String {
    let name = match errno {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::ESRCH => "ESRCH",
        libc::EINTR => "EINTR",
        libc::EIO => "EIO",
        libc::ENXIO => "ENXIO",
        libc::E2BIG => "E2BIG",
        libc::ENOEXEC => "ENOEXEC",
        libc::EBADF => "EBADF",
        libc::EAGAIN => "EAGAIN",
        libc::ENOMEM => "ENOMEM",
        libc::EACCES => "EACCES",
        libc::EFAULT => "EFAULT",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::ENODEV => "ENODEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EINVAL => "EINVAL",
        libc::ENOTTY => "ENOTTY",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EUSERS => "EUSERS",
        libc::ENOKEY => "ENOKEY",
        _ => return format!("errno {errno}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::checks;

    fn native() -> Arch {
        Arch::native().unwrap()
    }

    #[test]
    fn hako_sys_accepts_every_check() {
        for check in checks(native()) {
            let (outcome, _) = run_check(native(), &check);
            assert!(
                !matches!(outcome, Outcome::NotMade(_) | Outcome::NoSuchCall),
                "{}: {outcome:?}",
                check.name
            );
        }
    }

    #[test]
    fn errnos_are_named_and_an_unknown_one_is_shown_as_a_number() {
        assert_eq!(errno_name(libc::EPERM), "EPERM");
        assert_eq!(errno_name(libc::ENOSYS), "ENOSYS");
        assert_eq!(errno_name(libc::EFAULT), "EFAULT");
        assert_eq!(errno_name(4095), "errno 4095");
    }

    #[test]
    fn an_outcome_is_reported_with_ret_errno_and_error_always_present() {
        let ret = Value::Object(Outcome::Ret(3).to_json());
        assert_eq!(ret, json!({"ret": 3, "errno": null, "error": null}));
        let failed = Value::Object(Outcome::Errno(libc::EPERM).to_json());
        assert_eq!(
            failed,
            json!({"ret": null, "errno": libc::EPERM, "error": "EPERM"})
        );
        let missing = Value::Object(Outcome::NoSuchCall.to_json());
        assert_eq!(
            missing,
            json!({"ret": null, "errno": null, "error": null,
                   "not_made": "no such system call here"})
        );
        let declined = Value::Object(Outcome::NotMade("unsound").to_json());
        assert_eq!(declined["not_made"], json!("unsound"));
        assert!(raw(None, [0; 6]) == Outcome::NoSuchCall);
    }

    #[test]
    fn the_policy_answers_an_x32_call_with_enosys() {
        let policy = hako_seccomp::default_policy();
        for check in checks(native()) {
            if check.how == How::X32 {
                assert_eq!(
                    policy_errno(&policy, &check, &check.args),
                    Some(libc::ENOSYS)
                );
            }
        }
    }
}
