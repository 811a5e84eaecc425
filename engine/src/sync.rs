//! Small synchronisation helpers shared by the engine's modules.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering the data if a holder panicked (the engine's data is always left
/// consistent between statements). Never held across an `.await` or any I/O.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
