//! Rendering a policy to the OCI runtime-spec / Docker seccomp profile JSON.

use serde_json::{json, Map, Value};

use crate::compile::Arch;
use crate::policy::{Action, Op, Policy};

fn action_name(action: Action) -> &'static str {
    match action {
        Action::Allow => "SCMP_ACT_ALLOW",
        Action::Errno(_) => "SCMP_ACT_ERRNO",
    }
}

/// The seccomp profile for the architecture this crate was built for; see
/// [`to_oci_for`].
pub fn to_oci(policy: &Policy) -> Value {
    to_oci_for(policy, Arch::native())
}

/// The policy as the `linux.seccomp` object of an OCI runtime spec, which is
/// also the profile format of `docker run --security-opt seccomp=FILE` and
/// podman.
///
/// - `defaultAction` (and `defaultErrnoRet` for an errno default);
/// - `architectures`: `arch` only (omitted if `None`). libseccomp then gives
///   its bad-architecture action (by default a kill) to calls of other ABIs,
///   x32 and i386 included, as the BPF of [`crate::compile`] does;
/// - `syscalls`: one entry per rule, in order, with `names` (one name),
///   `action`, `errnoRet`, `args` when the rule has conditions, and the
///   rule's reason as `comment` (read by Docker, ignored by runtimes). An
///   argument is `{index, value, valueTwo, op}`; for `SCMP_CMP_MASKED_EQ`,
///   `value` is the mask and `valueTwo` the masked value, as libseccomp
///   takes them.
///
/// libseccomp resolves names for each listed architecture itself, so a name
/// missing on one is skipped there, as in [`crate::compile_for`]. Validate
/// the policy first ([`Policy::validate`]): invalid rules render as they are.
pub fn to_oci_for(policy: &Policy, arch: Option<Arch>) -> Value {
    let mut profile = Map::new();
    profile.insert("defaultAction".into(), action_name(policy.default).into());
    if let Action::Errno(errno) = policy.default {
        profile.insert("defaultErrnoRet".into(), errno.into());
    }
    if let Some(arch) = arch {
        profile.insert("architectures".into(), json!([arch.oci_name()]));
    }
    let syscalls: Vec<Value> = policy
        .rules
        .iter()
        .map(|rule| {
            let mut entry = Map::new();
            entry.insert("names".into(), json!([rule.syscall]));
            entry.insert("action".into(), action_name(rule.action).into());
            if let Action::Errno(errno) = rule.action {
                entry.insert("errnoRet".into(), errno.into());
            }
            if !rule.conditions.is_empty() {
                let args: Vec<Value> = rule
                    .conditions
                    .iter()
                    .map(|c| {
                        let (op, value, value_two) = match c.op {
                            Op::Eq => ("SCMP_CMP_EQ", c.value, 0),
                            Op::Ne => ("SCMP_CMP_NE", c.value, 0),
                            Op::MaskedEq(mask) => ("SCMP_CMP_MASKED_EQ", mask, c.value),
                        };
                        json!({"index": c.arg, "value": value, "valueTwo": value_two, "op": op})
                    })
                    .collect();
                entry.insert("args".into(), args.into());
            }
            entry.insert("comment".into(), rule.reason.clone().into());
            Value::Object(entry)
        })
        .collect();
    profile.insert("syscalls".into(), syscalls.into());
    Value::Object(profile)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{default_policy, Condition, Rule, EPERM};

    #[test]
    fn an_unconditional_and_a_masked_rule_render_exactly() {
        let policy = Policy {
            default: Action::Allow,
            rules: vec![
                Rule::errno("mount", EPERM, "no mounts"),
                Rule::errno("ioctl", EPERM, "no TIOCSTI").when(Condition::masked_eq(
                    1,
                    0xffff_ffff,
                    0x5412,
                )),
                Rule::errno("fcntl", 22, "example").when(Condition::eq(1, 4)),
            ],
        };
        let want = json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [
                {"names": ["mount"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1, "comment": "no mounts"},
                {"names": ["ioctl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1,
                 "args": [{"index": 1, "value": 4294967295u64, "valueTwo": 21522, "op": "SCMP_CMP_MASKED_EQ"}],
                 "comment": "no TIOCSTI"},
                {"names": ["fcntl"], "action": "SCMP_ACT_ERRNO", "errnoRet": 22,
                 "args": [{"index": 1, "value": 4, "valueTwo": 0, "op": "SCMP_CMP_EQ"}],
                 "comment": "example"},
            ]
        });
        assert_eq!(to_oci_for(&policy, Some(Arch::X86_64)), want);
    }

    #[test]
    fn an_errno_default_renders_its_errno() {
        let policy = Policy {
            default: Action::Errno(EPERM),
            rules: vec![Rule {
                syscall: "read".into(),
                action: Action::Allow,
                conditions: vec![Condition::ne(0, 3)],
                reason: "r".into(),
            }],
        };
        let want = json!({
            "defaultAction": "SCMP_ACT_ERRNO",
            "defaultErrnoRet": 1,
            "architectures": ["SCMP_ARCH_AARCH64"],
            "syscalls": [
                {"names": ["read"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 3, "valueTwo": 0, "op": "SCMP_CMP_NE"}],
                 "comment": "r"},
            ]
        });
        assert_eq!(to_oci_for(&policy, Some(Arch::Aarch64)), want);
    }

    #[test]
    fn the_default_policy_renders_one_entry_per_rule() {
        let policy = default_policy();
        let profile = to_oci(&policy);
        let entries = profile["syscalls"].as_array().unwrap();
        assert_eq!(entries.len(), policy.rules.len());
        let clone3 = entries
            .iter()
            .find(|e| e["names"] == json!(["clone3"]))
            .unwrap();
        assert_eq!(clone3["errnoRet"], 38);
        for entry in entries {
            for arg in entry["args"].as_array().into_iter().flatten() {
                assert!(arg["value"].is_u64() && arg["valueTwo"].is_u64());
            }
        }
    }
}
