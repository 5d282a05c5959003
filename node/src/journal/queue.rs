//! The bounded submission queue between callers and the committer.
//!
//! Callers hold the lock only to push; the committer only to pop. Nobody
//! holds it across I/O, so callers keep queueing the next group while the
//! committer writes and fsyncs the current one.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use super::Location;
use super::error::Result;

pub(crate) type Done = Box<dyn FnOnce(Result<Vec<Location>>) + Send>;

/// Frames submitted together: they land contiguously, in order, in one file.
pub(crate) struct Unit {
    /// The encoded frames, back to back.
    pub(crate) bytes: Vec<u8>,
    /// (tablet, index, whole frame length) of each frame, in order.
    pub(crate) frames: Vec<(u64, u64, u32)>,
    pub(crate) done: Done,
}

struct State {
    units: VecDeque<Unit>,
    frames: usize,
    closed: bool,
}

pub(crate) struct Queue {
    state: Mutex<State>,
    not_empty: Condvar,
    not_full: Condvar,
    frames_max: usize,
}

impl Queue {
    pub(crate) fn new(frames_max: usize) -> Queue {
        Queue {
            state: Mutex::new(State {
                units: VecDeque::new(),
                frames: 0,
                closed: false,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
            frames_max,
        }
    }

    /// Blocks while the queue is full. A unit larger than the whole queue is
    /// admitted once the queue is empty, so it cannot wait forever.
    /// Gives the unit back if the queue is closed.
    pub(crate) fn push(&self, unit: Unit) -> Result<(), Unit> {
        let mut state = self.state.lock().expect("queue lock");
        loop {
            if state.closed {
                return Err(unit);
            }
            let fits = state.frames + unit.frames.len() <= self.frames_max;
            if fits || state.units.is_empty() {
                break;
            }
            state = self.not_full.wait(state).expect("queue lock");
        }
        state.frames += unit.frames.len();
        state.units.push_back(unit);
        self.not_empty.notify_one();
        Ok(())
    }

    fn take_front(&self, state: &mut State) -> Unit {
        let unit = state.units.pop_front().expect("front exists");
        state.frames -= unit.frames.len();
        self.not_full.notify_all();
        unit
    }

    /// Waits for a unit; None once the queue is closed and drained.
    pub(crate) fn pop(&self) -> Option<Unit> {
        let mut state = self.state.lock().expect("queue lock");
        loop {
            if !state.units.is_empty() {
                return Some(self.take_front(&mut state));
            }
            if state.closed {
                return None;
            }
            state = self.not_empty.wait(state).expect("queue lock");
        }
    }

    /// Takes the next unit if one arrives before `deadline` and `fits` it;
    /// None when the deadline passes, the next unit does not fit, or the
    /// queue is closed and empty.
    pub(crate) fn pop_until(
        &self,
        deadline: Instant,
        fits: impl Fn(&Unit) -> bool,
    ) -> Option<Unit> {
        let mut state = self.state.lock().expect("queue lock");
        loop {
            if let Some(front) = state.units.front() {
                return fits(front).then(|| self.take_front(&mut state));
            }
            let now = Instant::now();
            if state.closed || now >= deadline {
                return None;
            }
            state = self
                .not_empty
                .wait_timeout(state, deadline - now)
                .expect("queue lock")
                .0;
        }
    }

    /// Refuses further pushes; queued units are still popped.
    pub(crate) fn close(&self) {
        self.state.lock().expect("queue lock").closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}
