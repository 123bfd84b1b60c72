//! The guest's children: reaping those that end (supervisors, the zygote,
//! the forwarder), continuing those a command stopped, and killing the
//! orphans of commands whose supervisor could not (or, under old gVisor,
//! cannot be a subreaper).

use std::time::Duration;

use hako_sys::rustix::process::{self as rproc, Pid, Signal, WaitOptions};

use super::Server;
use crate::proto::{self, RunReply};
use crate::supervise;
use crate::zygote::Zygote;

impl Server<'_> {
    /// Reaps every child that ended: supervisors, and orphans re-parented
    /// to the guest.
    pub(super) fn reap(&mut self) {
        while let Ok(Some((pid, status))) = rproc::wait(WaitOptions::NOHANG | WaitOptions::UNTRACED)
        {
            if status.stopped() {
                // A command may stop any process of its uid: a supervisor
                // stopped would enforce no deadline, and an idle one would
                // never take the next command. Whatever stopped it, it goes
                // on (every child of the guest is a supervisor, the
                // forwarder, or an orphan about to be killed).
                let _ = rproc::kill_process(pid, Signal::CONT);
                continue;
            }
            if self.zygote.as_ref().is_some_and(|z| z.pid() == pid) {
                // Killed from inside: replaced once no command runs.
                self.zygote = None;
                continue;
            }
            if let Some(at) = self.idle.iter().position(|(p, _)| *p == pid) {
                self.idle.swap_remove(at);
                continue;
            }
            if self.mode.forwarder == Some(pid) {
                // Killed from inside: the sandbox's proxy ports stop
                // answering; nothing else is affected.
                self.mode.forwarder = None;
                continue;
            }
            if let Some(session) = self.sessions.iter_mut().find(|s| s.supervisor == pid) {
                session.supervisor_reaped = true;
                if let Some(sup) = session.sup.take() {
                    let _ = sup.set_nonblocking(true);
                    let reply = proto::read_frame::<RunReply>(&sup).ok();
                    if reply.is_none() {
                        self.orphans = true;
                    }
                    if let Some(RunReply::Finished {
                        orphans_to_guest: true,
                        ..
                    }) = reply
                    {
                        self.orphans_come_here = true;
                    }
                    session.shell_ended(reply);
                }
                continue;
            }
            if let Some(exec) = self.execs.iter_mut().find(|e| e.supervisor == pid) {
                // Gone: it takes no other command.
                exec.reusable = None;
                if exec.sup.is_some() {
                    // It died before its reply was read; the reply may still
                    // be in the socket.
                    if let Some(sup) = exec.sup.take() {
                        let _ = sup.set_nonblocking(true);
                        exec.reply = proto::read_frame(&sup).ok();
                    }
                }
                if exec.reply.is_none() {
                    exec.supervisor_gone = true;
                    self.orphans = true;
                }
            }
        }
        if self.orphans {
            self.kill_orphans();
        }
    }

    /// Whether no process of any command is alive: no command or session
    /// runs, and every child of the guest is an idle supervisor or the
    /// forwarder (neither runs a command's code nor holds more than its
    /// socket).
    pub(super) fn no_command_alive(&self) -> bool {
        if !self.execs.is_empty() || !self.sessions.is_empty() {
            return false;
        }
        let known: Vec<Pid> = self
            .idle
            .iter()
            .map(|(p, _)| *p)
            .chain(self.mode.forwarder)
            .collect();
        hako_sys::proc::children_of(rproc::getpid())
            .is_ok_and(|children| children.iter().all(|c| known.contains(c)))
    }

    /// A supervisor killed before it cleaned up leaves its command's tree to
    /// the guest (their subreaper): kill every child that is not a
    /// supervisor.
    fn kill_orphans(&mut self) {
        let me = rproc::getpid();
        let supervisors: Vec<Pid> = self
            .execs
            .iter()
            .map(|e| e.supervisor)
            .chain(self.sessions.iter().map(|s| s.supervisor))
            .chain(self.idle.iter().map(|(p, _)| *p))
            .chain(self.mode.forwarder)
            .chain(self.zygote.as_ref().map(Zygote::pid))
            .collect();
        let mut found = false;
        if let Ok(children) = hako_sys::proc::children_of(me) {
            for pid in children.into_iter().filter(|p| !supervisors.contains(p)) {
                found = true;
                let _ = rproc::kill_process(pid, Signal::KILL);
            }
        }
        self.orphans = found;
    }

    /// Where orphans come here (no subreapers): once nothing runs, every
    /// child that is not a supervisor is an orphan of a command that has
    /// ended; kill them (each one's children come here in turn) before
    /// that command is reported, as a subreaper would have. At most a
    /// second.
    pub(super) fn kill_orphans_if_idle(&mut self) {
        let sessions_done = self
            .sessions
            .iter()
            .all(|s| s.ended.is_some() && s.sup.is_none());
        if !self.orphans_come_here || !self.execs.is_empty() || !sessions_done {
            return;
        }
        for _ in 0..1000 {
            self.kill_orphans();
            if !self.orphans {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
            self.reap();
        }
    }

    /// At shutdown: ends whatever is left (a stuck supervisor, the idle
    /// ones, the forwarder, the zygote, an orphan).
    pub(super) fn kill_what_is_left(&mut self) {
        // Our ends of the idle supervisors' sockets close here: they end.
        let helpers: Vec<Pid> = self
            .idle
            .drain(..)
            .map(|(pid, _)| pid)
            .chain(self.mode.forwarder)
            .chain(self.zygote.as_ref().map(Zygote::pid))
            .collect();
        if !self.kill_helpers_if_all_that_is_left(&helpers) {
            let mut status = None;
            supervise::kill_tree(None, &mut status);
        }
    }

    /// At shutdown, as pid 1 of the sandbox's pid namespace: when the only
    /// children left are `helpers` (idle supervisors and the forwarder,
    /// which never run a command's code), kills them without waiting, and
    /// says whether it did. This process's own exit then waits for them
    /// (the kernel kills and reaps every process of the namespace before
    /// pid 1 is gone), off hako's path. Anything else left (an orphan of a
    /// command, a stuck supervisor) is for `kill_tree`, which waits.
    fn kill_helpers_if_all_that_is_left(&self, helpers: &[Pid]) -> bool {
        let me = rproc::getpid();
        if !me.is_init() {
            return false;
        }
        let only_helpers = hako_sys::proc::children_of(me)
            .is_ok_and(|children| children.iter().all(|c| helpers.contains(c)));
        if !only_helpers {
            return false;
        }
        for &pid in helpers {
            let _ = rproc::kill_process(pid, Signal::KILL);
        }
        true
    }
}
