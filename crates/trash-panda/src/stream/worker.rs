//! The staging workers: threads that take the next queued block, claim a buffer for it, and fill
//! it outside the lock.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::pool::SlotState;
use super::source::Source;
use super::stagings::{Staging, StagingSource};
use super::{Shared, StreamError};
use crate::profile::clock_seconds;

/// Starts `count` workers; if one cannot start, stops and joins those that did.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    source: &Arc<dyn Source>,
    count: usize,
) -> Result<Vec<JoinHandle<()>>, StreamError> {
    let mut handles = Vec::with_capacity(count);
    for i in 0..count {
        let (sh, src) = (shared.clone(), source.clone());
        shared.lock().workers_alive += 1;
        let spawned = std::thread::Builder::new()
            .name(format!("tp-stage-{i}"))
            .spawn(move || run(&sh, &*src, i));
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                shared.lock().workers_alive -= 1;
                stop(shared, handles);
                return Err(StreamError::Spawn { source: e });
            }
        }
    }
    Ok(handles)
}

/// Tells the workers to stop, wakes everyone, and joins the workers. A worker in the middle of a
/// read gives up at its next chunk.
pub(crate) fn stop(shared: &Shared, handles: Vec<JoinHandle<()>>) {
    shared
        .stop
        .store(true, std::sync::atomic::Ordering::Relaxed);
    {
        let mut st = shared.lock();
        st.stop = true;
        st.queue.clear();
    }
    shared.cv.notify_all();
    for h in handles {
        // A worker only panics outside `fill` on a bug; its guard already woke the waiters.
        let _ = h.join();
    }
}

/// Counts the worker out when its thread ends, however it ends, so an `acquire` never waits for
/// workers that are gone.
struct Alive<'a>(&'a Shared);

impl Drop for Alive<'_> {
    fn drop(&mut self) {
        self.0.lock().workers_alive -= 1;
        self.0.cv.notify_all();
    }
}

fn run(shared: &Shared, source: &dyn Source, worker: usize) {
    let _alive = Alive(shared);
    let mut st = shared.lock();
    loop {
        if st.stop {
            return;
        }
        let Some(&block) = st.queue.front() else {
            st.end_buffer_wait();
            st = shared.wait(st);
            continue;
        };
        if st.find(block).is_some() {
            st.queue.pop_front();
            continue;
        }
        if !st.held {
            // A shared pool's engine between turns: the queue waits for its buffers, which is
            // no wait for a buffer of its own.
            st = shared.wait(st);
            continue;
        }
        let Some(slot) = st.pick_slot(block) else {
            st.begin_buffer_wait(block);
            st = shared.wait(st);
            continue;
        };
        st.end_buffer_wait();
        st.queue.pop_front();
        let s = &mut st.slots[slot];
        let reclaimed_unused = matches!(s.state, SlotState::Ready(_)) && !s.used;
        let mut buf = s
            .buf
            .take()
            .expect("an unleased, unfilled slot holds its buffer");
        s.state = SlotState::Filling(block);
        let generation = st.generation[block];
        st.slots[slot].generation = generation;
        st.stats.reclaimed_unused += u64::from(reclaimed_unused);
        drop(st);

        let start = clock_seconds();
        let result = catch_unwind(AssertUnwindSafe(|| {
            source.fill(block, &mut buf, &shared.stop)
        }));
        let end = clock_seconds();
        let seconds = end - start;

        st = shared.lock();
        let stamp = st.tick();
        let state = match result {
            Ok(Ok(filled)) => {
                st.stats
                    .staged(block, filled.bytes, filled.cold_bytes, seconds);
                let tier = st.stats.blocks[block].tier;
                st.stagings.push(Staging {
                    block,
                    worker,
                    start,
                    end,
                    bytes: filled.bytes,
                    source: StagingSource::of(tier, filled.cold_bytes),
                });
                if st.generation[block] == generation {
                    SlotState::Ready(block)
                } else {
                    // Its bytes changed while it was read: staged again when it is wanted.
                    SlotState::Empty
                }
            }
            Ok(Err(e)) => {
                st.stats.failures += 1;
                SlotState::Failed(block, e)
            }
            Err(panic) => {
                st.stats.failures += 1;
                let e = StreamError::WorkerPanicked {
                    block,
                    name: shared.names[block].clone(),
                    message: panic_message(&*panic),
                };
                SlotState::Failed(block, e)
            }
        };
        let s = &mut st.slots[slot];
        s.buf = Some(buf);
        s.state = state;
        s.stamp = stamp;
        s.used = false;
        shared.cv.notify_all();
    }
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}
