//! Quiescing a session's stdio for a migration: once the guest is frozen,
//! each output pump pushes what is still in its pipe and parks, and the
//! stdin writer parks handing back the bytes it had not written; the
//! migration then either ends them (the guest moved: no end of stream is
//! pushed, the target's pumps carry on) or lets them go on (it failed).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    requested: bool,
    /// Stdio threads still running (one that ended needs no parking).
    live: usize,
    parked: usize,
    /// `Some(true)`: the guest moved; `Some(false)`: it stays.
    outcome: Option<bool>,
    /// Bytes the stdin writer held when it parked.
    stdin: Vec<u8>,
}

/// The stdio threads' meeting point.
pub struct Freeze {
    m: Mutex<State>,
    cv: Condvar,
    /// Readable while a park is asked for: threads waiting on a descriptor
    /// poll this one beside it, so that a freeze does not wait out their
    /// poll interval.
    wake: OwnedFd,
}

impl Freeze {
    /// A meeting point (an eventfd to wake pollers with).
    pub fn new() -> std::io::Result<Freeze> {
        // SAFETY: eventfd with flags; a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Freeze {
            m: Mutex::default(),
            cv: Condvar::new(),
            // SAFETY: a new descriptor, ours.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// The descriptor that is readable while a park is asked for.
    pub fn waker(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    fn set_wake(&self, on: bool) {
        let fd = self.wake.as_raw_fd();
        let mut v = 0u64;
        // SAFETY: 8 bytes to or from an eventfd, from a local.
        unsafe {
            if on {
                v = 1;
                libc::write(fd, (&raw const v).cast(), 8);
            } else {
                libc::read(fd, (&raw mut v).cast(), 8);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.m
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A stdio thread is about to start (counted before it is spawned, so
    /// that no migration misses it): a migration waits for it to park until
    /// it ends, that is until the [`Member`] made from the token is dropped.
    pub fn enter(&self) -> Entered {
        self.lock().live += 1;
        Entered(())
    }

    /// The running thread's membership, from its [`Freeze::enter`] token.
    pub fn member(&self, _: Entered) -> Member<'_> {
        Member(self)
    }

    /// Asks the stdio threads to park.
    pub fn request(&self) {
        let mut s = self.lock();
        s.requested = true;
        s.outcome = None;
        s.stdin.clear();
        self.set_wake(true);
        self.cv.notify_all();
    }

    /// Whether a park was asked for.
    pub fn requested(&self) -> bool {
        self.lock().requested
    }

    /// Parks the calling stdio thread (the stdin writer hands over its
    /// bytes) until the migration's outcome; true: the guest moved.
    pub fn park(&self, stdin: Vec<u8>) -> bool {
        let mut s = self.lock();
        s.stdin.extend(stdin);
        s.parked += 1;
        self.cv.notify_all();
        while s.outcome.is_none() {
            s = self
                .cv
                .wait(s)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        s.parked -= 1;
        s.outcome == Some(true)
    }

    /// Waits until every stdio thread still running parked; false on
    /// timeout.
    pub fn wait_parked(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.parked < s.live {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }

    /// The bytes the stdin writer handed over.
    pub fn take_stdin(&self) -> Vec<u8> {
        std::mem::take(&mut self.lock().stdin)
    }

    /// Ends the park: `moved` tells the threads whether to stop.
    pub fn release(&self, moved: bool) {
        let mut s = self.lock();
        s.requested = false;
        s.outcome = Some(moved);
        self.set_wake(false);
        self.cv.notify_all();
    }
}

/// A stdio thread counted but not yet running.
#[must_use]
pub struct Entered(());

/// A running stdio thread's membership; it leaves when dropped.
pub struct Member<'a>(&'a Freeze);

impl Drop for Member<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.live -= 1;
        self.0.cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn threads_park_and_learn_the_outcome() {
        let f = Arc::new(Freeze::new().unwrap());
        let ended = f.member(f.enter());
        let members: Vec<_> = (0..2).map(|_| f.member(f.enter())).collect();
        f.request();
        let readable = |fd| {
            let mut p = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, no wait.
            unsafe { libc::poll(&raw mut p, 1, 0) == 1 }
        };
        assert!(readable(f.waker()), "pollers are woken");
        assert!(
            !f.wait_parked(Duration::from_millis(10)),
            "three threads run, none parked"
        );
        drop(ended);
        let t: Vec<_> = (0..2)
            .map(|i| {
                let f = Arc::clone(&f);
                std::thread::spawn(move || f.park(vec![i]))
            })
            .collect();
        assert!(
            f.wait_parked(Duration::from_secs(5)),
            "the two running threads parked; the one that ended is not waited for"
        );
        let mut got = f.take_stdin();
        got.sort_unstable();
        assert_eq!(got, vec![0, 1]);
        f.release(true);
        assert!(t.into_iter().all(|t| t.join().unwrap()));
        assert!(!f.requested());
        assert!(!readable(f.waker()), "the waker is quiet again");
        assert!(!f.wait_parked(Duration::from_millis(10)));
        drop(members);
        assert!(f.wait_parked(Duration::from_millis(10)), "no thread runs");
    }
}
