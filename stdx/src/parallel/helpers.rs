//! The threads behind [`for_each`](super::for_each): kept between calls instead of spawned for each one.
//! A fork-join of sixteen fresh threads costs a few hundred microseconds, as much as a whole batch's
//! planning in the GPU host stage; a parked helper is woken in a few. A call still gets exactly the
//! threads it asked for — idle helpers first, new ones beyond them — and runs nothing but its own work on
//! them (no stealing: a helper never runs another call's work while one of its own waits), so a nested
//! call or a lock held across one behaves as with scoped threads.

use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

/// One call's work handed to a helper, and the latch the call waits on.
struct Task {
    /// The call's work, its lifetime erased: [`run`] does not return before every helper it handed it
    /// to has finished it.
    work: &'static (dyn Fn() + Sync),
    done: Arc<Latch>,
}

/// Counts a call's helpers down to zero, keeping the first panic.
struct Latch {
    state: Mutex<(usize, Option<Box<dyn Any + Send>>)>,
    zero: Condvar,
}

impl Latch {
    fn finish(&self, panic: Option<Box<dyn Any + Send>>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        s.0 -= 1;
        if s.1.is_none() {
            s.1 = panic;
        }
        if s.0 == 0 {
            self.zero.notify_all();
        }
    }

    fn wait(&self) -> Option<Box<dyn Any + Send>> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while s.0 > 0 {
            s = self.zero.wait(s).unwrap_or_else(PoisonError::into_inner);
        }
        s.1.take()
    }
}

/// The parked helpers, each by the channel that wakes it, and the process they were started in: a
/// child made by `fork` (Python's multiprocessing, a DataLoader's workers) inherits the list but not the
/// threads, and must start its own rather than wait for work handed to threads that do not exist.
static IDLE: Mutex<(u32, Vec<Sender<Task>>)> = Mutex::new((0, Vec::new()));

/// A parked helper of this process, if any.
fn parked() -> Option<Sender<Task>> {
    let mut idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    if idle.0 != pid {
        // Started in another process (or none yet): their threads are not here. Forget them without
        // dropping: a channel's drop may take locks that a thread of the parent held at the fork.
        std::mem::forget(std::mem::take(&mut idle.1));
        idle.0 = pid;
    }
    idle.1.pop()
}

/// Runs `work` on the calling thread and on `helpers` more threads at once, and returns when all have
/// finished; a panic in any of them is raised here after that. A helper that cannot be started (the
/// system refused a thread) leaves its share to the others: `work` must be a loop over shared items, as
/// [`for_each`](super::for_each)'s worker is.
pub(super) fn run(helpers: usize, work: &(dyn Fn() + Sync)) {
    let latch = Arc::new(Latch {
        state: Mutex::new((helpers, None)),
        zero: Condvar::new(),
    });
    // SAFETY: only the lifetime changes (same fat pointer). Every copy goes into a Task counted by
    // `latch`, and this function waits for the latch below before it returns or unwinds (the caller's
    // own run is caught), so no helper touches `work` after the borrow ends.
    let erased: &'static (dyn Fn() + Sync) = unsafe { std::mem::transmute(work) };
    for _ in 0..helpers {
        let task = Task {
            work: erased,
            done: latch.clone(),
        };
        if let Err(task) = hand_over(task) {
            task.done.finish(None);
        }
    }
    let mine = catch_unwind(AssertUnwindSafe(work));
    let theirs = latch.wait();
    if let Err(p) = mine {
        resume_unwind(p);
    }
    if let Some(p) = theirs {
        resume_unwind(p);
    }
}

/// Gives `task` to a parked helper, or to a new one; back if no thread could take it.
fn hand_over(mut task: Task) -> Result<(), Task> {
    loop {
        let Some(wake) = parked() else { break };
        match wake.send(task) {
            Ok(()) => return Ok(()),
            // That helper is gone (its thread ended): try the next.
            Err(returned) => task = returned.0,
        }
    }
    let (wake, tasks) = channel();
    let first = Arc::new(Mutex::new(Some(task)));
    let handed = first.clone();
    let started = std::thread::Builder::new()
        .name("stdx-worker".into())
        .spawn(move || {
            let first = handed.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(task) = first {
                helper(task, wake, tasks);
            }
        });
    match started {
        Ok(_) => Ok(()),
        // The closure that held `handed` is dropped with the failed spawn: the task is still here.
        Err(_) => match first.lock().unwrap_or_else(PoisonError::into_inner).take() {
            Some(task) => Err(task),
            None => Ok(()),
        },
    }
}

/// A helper's life: run the task, report it, park, take the next.
fn helper(mut task: Task, wake: Sender<Task>, tasks: Receiver<Task>) {
    loop {
        let Task { work, done } = task;
        let panic = catch_unwind(AssertUnwindSafe(work)).err();
        // `work` is not used past this point: the call it borrows from may return now.
        done.finish(panic);
        drop(done);
        {
            let mut idle = IDLE.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.0 != std::process::id() {
                // A helper runs only in the process that started it: this cannot happen, but a helper
                // listed under another process's id would be forgotten, so it ends instead.
                return;
            }
            idle.1.push(wake.clone());
        }
        match tasks.recv() {
            Ok(next) => task = next,
            Err(_) => return,
        }
    }
}
