//! The bounded submission queue between callers and the committer.
//!
//! Callers hold the lock only to push; the committer only to pop. Nobody
//! holds it across I/O, so callers keep queueing the next group while the
//! committer writes and fsyncs the current one.
//!
//! A push wakes the committer only when it has something to do: when it
//! waits for a first unit, or when it lingers for more and the queue now
//! holds enough to fill its group. A committer lingering for a group is not
//! woken per unit (each wake is a futex call and a thread switch, and at
//! thousands of small appends per second those were a large share of a
//! node's CPU); it takes what came at the end of its linger, in one go.

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
    bytes: usize,
    closed: bool,
    waiter: Waiter,
}

/// What the committer waits for, if it waits.
#[derive(Clone, Copy)]
enum Waiter {
    /// Not waiting, or already woken.
    None,
    /// For a first unit: any push wakes it.
    Idle,
    /// Lingering for more of its group, which has room for these: a push
    /// wakes it once the queue holds as much (the group is full then).
    Lingering {
        bytes_room: usize,
        frames_room: usize,
    },
}

pub(crate) struct Queue {
    state: Mutex<State>,
    /// Pushes that woke the committer (for tests).
    wakes: std::sync::atomic::AtomicU64,
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
                bytes: 0,
                closed: false,
                waiter: Waiter::None,
            }),
            wakes: Default::default(),
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
        state.bytes += unit.bytes.len();
        state.units.push_back(unit);
        let wake = match state.waiter {
            Waiter::None => false,
            Waiter::Idle => true,
            Waiter::Lingering {
                bytes_room,
                frames_room,
            } => state.bytes >= bytes_room || state.frames >= frames_room,
        };
        if wake {
            state.waiter = Waiter::None;
            self.wakes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.not_empty.notify_one();
        }
        Ok(())
    }

    fn take_front(&self, state: &mut State) -> Unit {
        let unit = state.units.pop_front().expect("front exists");
        state.frames -= unit.frames.len();
        state.bytes -= unit.bytes.len();
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
            state.waiter = Waiter::Idle;
            state = self.not_empty.wait(state).expect("queue lock");
            state.waiter = Waiter::None;
        }
    }

    /// Takes the next unit if one arrives before `deadline` and `fits` it;
    /// None when the deadline passes, the next unit does not fit, or the
    /// queue is closed and empty. The group being built has room for
    /// `bytes_room` and `frames_room` more: while the queue is empty, the
    /// caller sleeps until the deadline or until as much has arrived.
    pub(crate) fn pop_until(
        &self,
        deadline: Instant,
        (bytes_room, frames_room): (usize, usize),
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
            state.waiter = Waiter::Lingering {
                bytes_room,
                frames_room,
            };
            state = self
                .not_empty
                .wait_timeout(state, deadline - now)
                .expect("queue lock")
                .0;
            state.waiter = Waiter::None;
        }
    }

    /// Refuses further pushes; queued units are still popped.
    pub(crate) fn close(&self) {
        self.state.lock().expect("queue lock").closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    use super::*;

    fn unit(bytes: usize) -> Unit {
        Unit {
            bytes: vec![0; bytes],
            frames: vec![(1, 1, bytes as u32)],
            done: Box::new(|_| {}),
        }
    }

    fn lingering(q: &Queue) -> bool {
        matches!(q.state.lock().unwrap().waiter, Waiter::Lingering { .. })
    }

    /// A committer lingering for its group sleeps through pushes that do
    /// not fill it, and is woken once, by the push that does.
    #[test]
    fn a_lingering_committer_is_woken_only_by_a_full_group() {
        let q = Arc::new(Queue::new(1000));
        let taker = {
            let q = q.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut got = Vec::new();
                while let Some(u) = q.pop_until(deadline, (1 << 20, 5 - got.len()), |_| true) {
                    got.push(u);
                    if got.len() == 5 {
                        break;
                    }
                }
                got.len()
            })
        };
        while !lingering(&q) {
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..4 {
            assert!(q.push(unit(10)).is_ok());
        }
        assert_eq!(
            q.wakes.load(Ordering::Relaxed),
            0,
            "woken before the group was full"
        );
        assert!(q.push(unit(10)).is_ok());
        assert_eq!(taker.join().unwrap(), 5);
        assert_eq!(q.wakes.load(Ordering::Relaxed), 1);
    }

    /// An idle committer is woken by the first push.
    #[test]
    fn an_idle_committer_is_woken_by_any_push() {
        let q = Arc::new(Queue::new(1000));
        let taker = {
            let q = q.clone();
            std::thread::spawn(move || q.pop().map(|u| u.bytes.len()))
        };
        while !matches!(q.state.lock().unwrap().waiter, Waiter::Idle) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(q.push(unit(7)).is_ok());
        assert_eq!(taker.join().unwrap(), Some(7));
        assert_eq!(q.wakes.load(Ordering::Relaxed), 1);
    }
}
