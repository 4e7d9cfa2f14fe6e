//! The consumer's locks guard state that every change leaves sound (one push, pop, count or
//! swap), so a lock a panicking holder poisoned is taken all the same.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `mutex`'s guard, poisoned or not.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
