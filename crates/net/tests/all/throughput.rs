//! Relay throughput against direct loopback. Not asserted (tests never
//! assert wall-clock times); run with
//! `cargo test -p hako-net --release -- --ignored --nocapture throughput`.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::*;

const TOTAL: usize = 100 << 20;
const CHUNK: usize = 256 << 10;
const ROUNDS: usize = 15;

/// A server that, per connection, either swallows everything and answers
/// with the count (`up`) or sends `TOTAL` bytes (`down`).
fn sink_or_source(down: bool) -> (u16, thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        for _ in 0..2 * ROUNDS {
            let (mut s, _) = l.accept().unwrap();
            if down {
                let buf = vec![7u8; CHUNK];
                let mut sent = 0;
                while sent < TOTAL {
                    s.write_all(&buf).unwrap();
                    sent += CHUNK;
                }
                s.shutdown(Shutdown::Write).unwrap();
            } else {
                let mut buf = vec![0u8; CHUNK];
                let mut got = 0u64;
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    got += n as u64;
                }
                s.write_all(&got.to_be_bytes()).unwrap();
            }
        }
    });
    (port, h)
}

trait HalfClose: Read + Write {
    fn close_write(&self);
}

impl HalfClose for TcpStream {
    fn close_write(&self) {
        self.shutdown(Shutdown::Write).unwrap();
    }
}

impl HalfClose for std::os::unix::net::UnixStream {
    fn close_write(&self) {
        self.shutdown(Shutdown::Write).unwrap();
    }
}

fn run(s: &mut impl HalfClose, down: bool) -> Duration {
    let t = Instant::now();
    if down {
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            got += n;
        }
        assert_eq!(got, TOTAL);
    } else {
        let buf = vec![7u8; CHUNK];
        let mut sent = 0;
        while sent < TOTAL {
            s.write_all(&buf).unwrap();
            sent += CHUNK;
        }
        s.close_write();
        let mut n = [0u8; 8];
        s.read_exact(&mut n).unwrap();
        assert_eq!(u64::from_be_bytes(n), TOTAL as u64);
    }
    t.elapsed()
}

/// The median time of `ROUNDS` transfers, direct and through the proxy.
fn measure(down: bool) -> (Duration, Duration) {
    let (port, srv) = sink_or_source(down);
    let p = proxy(&entry(format!("127.0.0.1:{port}")));
    let mut direct = Vec::new();
    let mut via = Vec::new();
    for _ in 0..ROUNDS {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        direct.push(run(&mut s, down));
        drop(s);
        let mut c = client(&p);
        c.write_all(format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .unwrap();
        read_head(&mut c);
        via.push(run(&mut c, down));
    }
    srv.join().unwrap();
    direct.sort();
    via.sort();
    (direct[ROUNDS / 2], via[ROUNDS / 2])
}

#[test]
#[ignore = "benchmark: prints the proxy/direct throughput ratio"]
fn throughput_through_connect_vs_direct_loopback() {
    for (name, down) in [("upload", false), ("download", true)] {
        let (direct, via) = measure(down);
        let mib = (TOTAL >> 20) as f64;
        println!(
            "{name}: direct {:.0} MiB/s, via proxy {:.0} MiB/s, ratio {:.2}",
            mib / direct.as_secs_f64(),
            mib / via.as_secs_f64(),
            direct.as_secs_f64() / via.as_secs_f64()
        );
    }
}
