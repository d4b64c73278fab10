//! The memory the next stage's early reads may fill while the stage before it still runs.
//!
//! It starts at what is free beside the running stage; each read takes its bytes before it
//! starts and waits while they are not there; memory the running stage gives back (a block
//! freed by its final pass, the stage released) is added; once the next stage starts, its own
//! plan holds and the allowance stops limiting.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::PipelineError;

/// What an allowance has done.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AllowanceStats {
    /// Bytes taken by reads.
    pub taken: u64,
    /// Bytes given back by the running stage.
    pub given: u64,
    /// Takes that had to wait for memory.
    pub waits: u64,
    /// Seconds those takes waited.
    pub wait_seconds: f64,
}

#[derive(Debug)]
struct State {
    available: u64,
    unlimited: bool,
    closed: bool,
    /// Reads wait whatever is available, until resumed or opened (the runner found that
    /// reading beside the running stage costs it more than the read saves).
    held: bool,
    /// Takes waiting now.
    waiting: usize,
    stats: AllowanceStats,
}

/// A byte budget shared by the thread that reads the next stage and the one that frees the
/// running stage's memory. `Send + Sync`.
#[derive(Debug)]
pub struct Allowance {
    stage: String,
    state: Mutex<State>,
    cv: Condvar,
}

impl Allowance {
    /// An allowance of `bytes` for the reads of `stage` (its name, for errors).
    pub fn new(stage: impl Into<String>, bytes: u64) -> Self {
        Allowance {
            stage: stage.into(),
            state: Mutex::new(State {
                available: bytes,
                unlimited: false,
                closed: false,
                held: false,
                waiting: 0,
                stats: AllowanceStats::default(),
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing under this lock panics; the counts stay right if a holder did.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `bytes`, waiting until they are there (or the allowance is opened); an error if it
    /// is closed meanwhile. A read larger than anything the running stage can give back waits
    /// for the next stage's start, which opens the allowance.
    pub fn take(&self, bytes: u64) -> Result<(), PipelineError> {
        let mut st = self.lock();
        let started = Instant::now();
        let mut waited = false;
        loop {
            if st.closed {
                return Err(PipelineError::Closed {
                    stage: self.stage.clone(),
                    wanted: bytes,
                });
            }
            if st.unlimited || (!st.held && st.available >= bytes) {
                break;
            }
            waited = true;
            st.waiting += 1;
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting -= 1;
        }
        if !st.unlimited {
            st.available -= bytes;
        }
        st.stats.taken = st.stats.taken.saturating_add(bytes);
        if waited {
            st.stats.waits += 1;
            st.stats.wait_seconds += started.elapsed().as_secs_f64();
        }
        Ok(())
    }

    /// Takes `bytes` if they are there now, without waiting.
    pub fn try_take(&self, bytes: u64) -> bool {
        let mut st = self.lock();
        if st.closed || !(st.unlimited || (!st.held && st.available >= bytes)) {
            return false;
        }
        if !st.unlimited {
            st.available -= bytes;
        }
        st.stats.taken = st.stats.taken.saturating_add(bytes);
        true
    }

    /// The running stage gave back `bytes`.
    pub fn give(&self, bytes: u64) {
        let mut st = self.lock();
        st.available = st.available.saturating_add(bytes);
        st.stats.given += bytes;
        drop(st);
        self.cv.notify_all();
    }

    /// Reads wait from now on, whatever memory is there, until [`resume`](Self::resume) or
    /// [`open`](Self::open): the read ahead is paused, and what it has not read is read at the
    /// stage's start.
    pub fn hold(&self) {
        self.lock().held = true;
    }

    /// Reads take what is there again after [`hold`](Self::hold).
    pub fn resume(&self) {
        self.lock().held = false;
        self.cv.notify_all();
    }

    /// Whether reads are held (and the allowance not opened since).
    pub fn is_held(&self) -> bool {
        let st = self.lock();
        st.held && !st.unlimited
    }

    /// The stage the reads are for starts: its plan holds from now on, so nothing waits.
    pub fn open(&self) {
        self.lock().unlimited = true;
        self.cv.notify_all();
    }

    /// The stage the reads are for is dropped: waiting and later takes fail.
    pub fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }

    /// Bytes a read may take now without waiting (`u64::MAX` once opened).
    pub fn available(&self) -> u64 {
        let st = self.lock();
        if st.unlimited {
            u64::MAX
        } else {
            st.available
        }
    }

    /// Takes waiting for memory now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Whether [`open`](Self::open) was called: reads then take without limit.
    pub fn is_open(&self) -> bool {
        self.lock().unlimited
    }

    /// What the allowance has done so far (a copy).
    pub fn stats(&self) -> AllowanceStats {
        self.lock().stats
    }

    /// The stage the allowance serves.
    pub fn stage(&self) -> &str {
        &self.stage
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    /// Polls `cond` until it holds (the deadline only guards against a hang).
    fn until(cond: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(Instant::now() < deadline, "condition never held");
            std::thread::yield_now();
        }
    }

    #[test]
    fn takes_within_the_allowance_do_not_wait() {
        let a = Allowance::new("dit", 100);
        a.take(60).unwrap();
        assert!(a.try_take(40));
        assert!(!a.try_take(1));
        assert_eq!(a.available(), 0);
        assert_eq!(a.stats().waits, 0);
        assert_eq!(a.stats().taken, 100);
    }

    #[test]
    fn a_take_waits_for_memory_given_back() {
        let a = Arc::new(Allowance::new("dit", 10));
        let a2 = a.clone();
        let reader = std::thread::spawn(move || a2.take(30));
        until(|| a.waiting() == 1);
        a.give(5);
        // Still short (15 of 30): the reader waits again.
        until(|| a.waiting() == 1);
        assert!(!reader.is_finished());
        a.give(15);
        reader.join().unwrap().unwrap();
        let s = a.stats();
        assert_eq!((s.taken, s.given, s.waits), (30, 20, 1));
        assert_eq!(a.available(), 0);
    }

    #[test]
    fn opening_lets_any_read_through() {
        let a = Arc::new(Allowance::new("vae", 0));
        let a2 = a.clone();
        let reader = std::thread::spawn(move || a2.take(1 << 40));
        until(|| a.waiting() == 1);
        a.open();
        reader.join().unwrap().unwrap();
        assert!(a.is_open());
        assert_eq!(a.available(), u64::MAX);
        assert!(a.try_take(u64::MAX));
    }

    #[test]
    fn a_held_allowance_lets_no_read_through_until_resumed_or_opened() {
        let a = Arc::new(Allowance::new("dit", 100));
        a.hold();
        assert!(a.is_held());
        assert!(!a.try_take(10));
        let a2 = a.clone();
        let reader = std::thread::spawn(move || a2.take(10));
        until(|| a.waiting() == 1);
        a.resume();
        reader.join().unwrap().unwrap();
        assert_eq!(a.available(), 90);
        a.hold();
        let a2 = a.clone();
        let reader = std::thread::spawn(move || a2.take(10));
        until(|| a.waiting() == 1);
        a.open();
        reader.join().unwrap().unwrap();
        assert!(!a.is_held());
    }

    #[test]
    fn closing_fails_the_waiting_read_with_its_stage() {
        let a = Arc::new(Allowance::new("text", 0));
        let a2 = a.clone();
        let reader = std::thread::spawn(move || a2.take(8));
        a.close();
        let err = reader.join().unwrap().unwrap_err();
        assert_eq!(
            err,
            PipelineError::Closed {
                stage: "text".into(),
                wanted: 8
            }
        );
        assert!(err.to_string().contains("\"text\""), "{err}");
        assert!(!a.try_take(0));
    }
}
