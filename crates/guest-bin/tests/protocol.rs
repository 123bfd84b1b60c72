//! The guest's protocol, spoken raw to the real `hako-guest` binary: the
//! handshake, bad frames, and many commands on one connection.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hako_proto::{
    self as proto, Cwd, ExecRequest, Frame, FromGuest, Hello, StreamId, ToGuest, MAX_FRAME,
};

/// Starts the guest with `ctl` at fd 3 (its only descriptor but stdio).
fn start() -> (Child, UnixStream) {
    let (ours, theirs) = UnixStream::pair().unwrap();
    let theirs = OwnedFd::from(theirs);
    // HAKO_GUEST runs these against another build (the static one in CI).
    let guest =
        std::env::var_os("HAKO_GUEST").unwrap_or_else(|| env!("CARGO_BIN_EXE_hako-guest").into());
    let mut command = Command::new(guest);
    command
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    hako_sys::spawn::prepare(
        &mut command,
        hako_sys::spawn::ChildSetup {
            fd3: Some(theirs),
            ..Default::default()
        },
    );
    let child = command.spawn().unwrap();
    drop(command);
    ours.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    (child, ours)
}

fn hello(ctl: &UnixStream) {
    proto::write_frame(
        ctl,
        &ToGuest::Hello(Box::new(Hello {
            version: proto::VERSION,
            linux: None,
            network: None,
            memory: None,
            confine: None,
            seal: None,
        })),
    )
    .unwrap();
    assert!(matches!(
        proto::read_frame::<FromGuest>(ctl).unwrap(),
        FromGuest::Ready { .. }
    ));
}

fn exec(id: u64, script: &str) -> Frame<ToGuest> {
    Frame::Message(ToGuest::Exec(ExecRequest {
        id,
        argv: vec!["sh".into(), "-c".into(), script.into()],
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: Cwd::Path("/".into()),
        timeout_ms: Some(20_000),
        stdin: false,
        max_output: 1 << 20,
        pty: None,
    }))
}

fn send(ctl: &UnixStream, frame: &Frame<ToGuest>) {
    (&*ctl).write_all(&proto::encode(frame).unwrap()).unwrap();
}

/// Reads frames until command `id` ends; returns its stdout and the end.
fn collect(ctl: &UnixStream, id: u64) -> (Vec<u8>, FromGuest) {
    let mut out = Vec::new();
    loop {
        match proto::read_any::<FromGuest>(ctl).unwrap() {
            Frame::Output {
                id: i,
                stream: StreamId::Stdout,
                offset,
                data,
            } if i == id => {
                assert_eq!(offset, out.len() as u64, "offsets number the bytes");
                out.extend(data);
            }
            Frame::Message(msg) => match &msg {
                FromGuest::Exited { id: i, .. }
                | FromGuest::SpawnFailed { id: i, .. }
                | FromGuest::Failed { id: Some(i), .. }
                    if *i == id =>
                {
                    return (out, msg)
                }
                _ => {}
            },
            _ => {}
        }
    }
}

/// Sends `hello` to a new guest, which must refuse it and exit with a
/// failure; returns what it said.
fn refused_at_handshake(hello: Hello) -> String {
    let (mut child, ctl) = start();
    proto::write_frame(&ctl, &ToGuest::Hello(Box::new(hello))).unwrap();
    let message = match proto::read_frame::<FromGuest>(&ctl).unwrap() {
        FromGuest::Refused { message, .. } => message,
        other => panic!("{other:?}"),
    };
    assert!(!child.wait().unwrap().success());
    message
}

#[test]
fn an_unknown_version_is_refused_at_the_handshake() {
    let message = refused_at_handshake(Hello {
        version: proto::VERSION + 1,
        linux: None,
        network: None,
        memory: None,
        confine: None,
        seal: None,
    });
    assert!(message.contains("version"), "{message}");
}

/// A seal that cannot be applied ends the guest before it serves: here a
/// directory mask over a regular file, which no mount can make (for root
/// ENOTDIR, for anyone else EPERM), so nothing is mounted on this host.
#[test]
fn a_seal_that_cannot_be_applied_is_refused_and_nothing_is_served() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let message = refused_at_handshake(Hello {
        version: proto::VERSION,
        linux: None,
        network: None,
        memory: None,
        confine: None,
        seal: Some(proto::Seal {
            mask_files: Vec::new(),
            mask_dirs: vec![file.path().to_path_buf()],
            seccomp: true,
            guard: false,
            pids_max: None,
        }),
    });
    assert!(message.contains("cannot seal the sandbox"), "{message}");
    assert!(
        message.contains(&file.path().display().to_string()),
        "names the path: {message}"
    );
}

#[test]
fn bad_frames_get_an_error_and_the_guest_stays_up() {
    let (mut child, ctl) = start();
    hello(&ctl);
    // Malformed JSON, an unknown tag, an output frame sent the wrong way,
    // a second handshake, and an oversized frame (its bytes follow).
    let mut bad = Vec::new();
    for payload in [&b"{nope"[..], &[9, 9, 9][..]] {
        bad.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        bad.extend_from_slice(payload);
    }
    (&ctl).write_all(&bad).unwrap();
    let wrong_way = proto::encode(&Frame::<FromGuest>::Output {
        id: 1,
        stream: StreamId::Stdout,
        offset: 0,
        data: b"x".to_vec(),
    })
    .unwrap();
    (&ctl).write_all(&wrong_way).unwrap();
    send(
        &ctl,
        &Frame::Message(ToGuest::Hello(Box::new(Hello {
            version: proto::VERSION,
            linux: None,
            network: None,
            memory: None,
            confine: None,
            seal: None,
        }))),
    );
    let big = MAX_FRAME + 1;
    (&ctl).write_all(&big.to_be_bytes()).unwrap();
    let chunk = vec![b'x'; 1 << 20];
    let mut left = big as usize;
    while left > 0 {
        let n = left.min(chunk.len());
        (&ctl).write_all(&chunk[..n]).unwrap();
        left -= n;
    }
    let mut errors = 0;
    while errors < 5 {
        match proto::read_frame::<FromGuest>(&ctl).unwrap() {
            FromGuest::Failed { id: None, .. } => errors += 1,
            other => panic!("expected an error reply, got {other:?}"),
        }
    }
    // Still in step and serving.
    send(&ctl, &exec(7, "echo alive"));
    let (out, end) = collect(&ctl, 7);
    assert_eq!(out, b"alive\n");
    assert!(matches!(end, FromGuest::Exited { .. }), "{end:?}");
    drop(ctl);
    child.wait().unwrap();
}

#[test]
fn bad_requests_name_the_command_and_change_nothing() {
    let (mut child, ctl) = start();
    hello(&ctl);
    // An empty argv, a relative working directory, and a descriptor
    // promised but not sent.
    let request = |id: u64, argv: Vec<String>, cwd: Cwd| {
        send(
            &ctl,
            &Frame::Message(ToGuest::Exec(ExecRequest {
                id,
                argv,
                env: vec![],
                cwd,
                timeout_ms: None,
                stdin: false,
                max_output: 10,
                pty: None,
            })),
        );
        match proto::read_frame::<FromGuest>(&ctl).unwrap() {
            FromGuest::Failed {
                id: Some(i),
                message,
                ..
            } if i == id => message,
            other => panic!("{other:?}"),
        }
    };
    assert!(request(1, vec![], Cwd::Path("/".into())).contains("empty"));
    assert!(request(2, vec!["true".into()], Cwd::Path("rel".into())).contains("absolute"));
    assert!(request(3, vec!["true".into()], Cwd::Fd).contains("descriptor"));
    send(&ctl, &exec(4, "echo ok"));
    assert_eq!(collect(&ctl, 4).0, b"ok\n");
    drop(ctl);
    child.wait().unwrap();
}

#[test]
fn many_commands_run_at_once_on_one_connection() {
    let (mut child, ctl) = start();
    hello(&ctl);
    for id in 1..=20u64 {
        send(
            &ctl,
            &exec(id, &format!("sleep 0.$((RANDOM % 3)); echo {id}")),
        );
    }
    let mut outs: std::collections::BTreeMap<u64, Vec<u8>> = Default::default();
    let mut ended = std::collections::BTreeSet::new();
    while ended.len() < 20 {
        match proto::read_any::<FromGuest>(&ctl).unwrap() {
            Frame::Output { id, data, .. } => {
                assert!(!ended.contains(&id), "output of {id} after its end");
                outs.entry(id).or_default().extend(data);
            }
            Frame::Message(FromGuest::Exited { id, status, .. }) => {
                assert_eq!(status, hako_core::ExitStatus::Code(0));
                assert!(ended.insert(id));
            }
            other => panic!("{other:?}"),
        }
    }
    for id in 1..=20u64 {
        assert_eq!(outs[&id], format!("{id}\n").into_bytes());
    }
    drop(ctl);
    child.wait().unwrap();
}

/// Starts the guest with `--stdio`: frames on its stdin and stdout.
fn start_stdio() -> (Child, std::process::ChildStdin, std::process::ChildStdout) {
    let guest =
        std::env::var_os("HAKO_GUEST").unwrap_or_else(|| env!("CARGO_BIN_EXE_hako-guest").into());
    let mut child = Command::new(guest)
        .arg("--stdio")
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    (child, stdin, stdout)
}

#[test]
fn the_guest_serves_over_its_stdin_and_stdout_too() {
    let (mut child, mut to, mut from) = start_stdio();
    proto::write_frame(
        &mut to,
        &ToGuest::Hello(Box::new(Hello {
            version: proto::VERSION,
            linux: None,
            network: None,
            memory: None,
            confine: None,
            seal: None,
        })),
    )
    .unwrap();
    assert!(matches!(
        proto::read_frame::<FromGuest>(&mut from).unwrap(),
        FromGuest::Ready { .. }
    ));
    // A command, its output and end, as over the socket.
    to.write_all(&proto::encode(&exec(1, "echo over-pipes; echo err >&2")).unwrap())
        .unwrap();
    let mut out = Vec::new();
    loop {
        match proto::read_any::<FromGuest>(&mut from).unwrap() {
            Frame::Output {
                id: 1,
                stream: StreamId::Stdout,
                data,
                ..
            } => out.extend(data),
            Frame::Message(FromGuest::Exited { id: 1, status, .. }) => {
                assert_eq!(status, hako_core::ExitStatus::Code(0));
                break;
            }
            _ => {}
        }
    }
    assert_eq!(out, b"over-pipes\n");
    // No descriptor can come this way: a request that says one did is
    // refused, and the guest goes on.
    let mut request = exec(2, "true");
    if let Frame::Message(ToGuest::Exec(r)) = &mut request {
        r.cwd = Cwd::Fd;
    }
    to.write_all(&proto::encode(&request).unwrap()).unwrap();
    match proto::read_frame::<FromGuest>(&mut from).unwrap() {
        FromGuest::Failed {
            id: Some(2),
            message,
            ..
        } => {
            assert!(message.contains("not accepted"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    drop(to);
    // End of its input ends it, and it says so last.
    loop {
        match proto::read_any::<FromGuest>(&mut from) {
            Ok(Frame::Message(FromGuest::Bye {})) => break,
            Ok(_) => {}
            Err(e) => panic!("no Bye before the end: {e}"),
        }
    }
    assert!(child.wait().unwrap().success());
}

fn empty_linux_spec() -> hako_proto::LinuxSpec {
    hako_proto::LinuxSpec {
        uid: (1000, 1000),
        gid: (1000, 1000),
        hostname: "x".into(),
        mounts: vec![],
        rlimits: vec![],
        landlock: None,
        seccomp: false,
        cgroup_procs: vec![],
        oom_counter: None,
        host_network: false,
        network: None,
    }
}

/// A seal goes with a guest that serves where it is; beside a linux spec
/// it is refused, never ignored (and no sandbox is built).
#[test]
fn a_seal_beside_a_linux_spec_is_refused() {
    let message = refused_at_handshake(Hello {
        version: proto::VERSION,
        linux: Some(empty_linux_spec()),
        network: None,
        memory: None,
        confine: None,
        seal: Some(proto::Seal::default()),
    });
    assert!(message.contains("seal"), "{message}");
}

#[test]
fn a_guest_over_pipes_refuses_to_build_a_linux_sandbox() {
    let (mut child, mut to, mut from) = start_stdio();
    let spec = empty_linux_spec();
    proto::write_frame(
        &mut to,
        &ToGuest::Hello(Box::new(Hello {
            version: proto::VERSION,
            linux: Some(spec),
            network: None,
            memory: None,
            confine: None,
            seal: None,
        })),
    )
    .unwrap();
    match proto::read_frame::<FromGuest>(&mut from).unwrap() {
        FromGuest::Refused { message, .. } => assert!(message.contains("socket"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(!child.wait().unwrap().success());
}
