//! A tmux server of a test's own: a real terminal to run `hako shell` on
//! and read the screen of (shared by the CLI's test binaries).

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A tmux server of the test's own, with one window running `sh`.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn start() -> Option<Tmux> {
        if Command::new("tmux").arg("-V").output().is_err() {
            assert!(
                std::env::var_os("HAKO_MUST_WORK").is_none_or(|v| v != "1"),
                "tmux is not installed and HAKO_MUST_WORK=1"
            );
            eprintln!("SKIPPED: tmux is not installed");
            return None;
        }
        // One server per test, also when tests of one binary run at once.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let tmux = Tmux {
            socket: format!(
                "hako-test-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ),
        };
        let ok = tmux
            .cmd(&["new-session", "-d", "-s", "t", "-x", "80", "-y", "24", "sh"])
            .success();
        assert!(ok, "tmux new-session failed");
        Some(tmux)
    }

    pub fn cmd(&self, args: &[&str]) -> std::process::ExitStatus {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .env("TERM", "xterm")
            .status()
            .unwrap()
    }

    pub fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).success());
    }

    pub fn screen(&self) -> String {
        let out = Command::new("tmux")
            .args(["-L", &self.socket, "capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Waits until the screen shows `needle` (from a computed echo, so the
    /// typed command line does not count).
    pub fn wait_for(&self, needle: &str) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if screen.contains(needle) {
                return screen;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{needle:?} never showed on the terminal:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}
