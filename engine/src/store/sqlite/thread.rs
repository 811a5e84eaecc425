//! The store on a thread of its own: SQLite calls block (on the disk, on a busy database), so
//! they never run on the async runtime's workers. Callers send a closure and await its answer;
//! the queue in between is bounded, so a flood of requests waits instead of growing memory.

use tokio::sync::{mpsc, oneshot};

use super::Store;
use crate::error::{Error, Result};

/// Requests waiting for the store thread at most; further callers wait for room.
const QUEUE: usize = 1024;

type Job = Box<dyn FnOnce(&mut Store) + Send>;

/// The handle to the thread that owns the [`Store`]. Cheap to share; the thread ends (closing
/// the database) once every handle is gone and the queue is empty.
pub(crate) struct StoreThread {
    requests: mpsc::Sender<Job>,
}

impl StoreThread {
    pub(crate) fn start(store: Store) -> Result<Self> {
        let (requests, mut queue) = mpsc::channel::<Job>(QUEUE);
        std::thread::Builder::new()
            .name("evervm-store".to_owned())
            .spawn(move || {
                let mut store = store;
                while let Some(job) = queue.blocking_recv() {
                    // A panic in one request (a bug) must not take every later one with it.
                    let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        job(&mut store);
                    }));
                    if ran.is_err() {
                        tracing::error!("a store request panicked; the store goes on");
                    }
                }
            })
            .map_err(|e| Error::internal(format!("cannot start the store thread: {e}")))?;
        Ok(Self { requests })
    }

    /// Runs `f` on the store thread and returns its answer.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T>
    where
        F: FnOnce(&mut Store) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.submit(f).await?.answer().await
    }

    /// Queues `f` (waiting only for room in the queue) and returns the way to its answer, so
    /// the caller can go on while the store works. Requests run in the order they were queued.
    pub(crate) async fn submit<T, F>(&self, f: F) -> Result<Pending<T>>
    where
        F: FnOnce(&mut Store) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job: Job = Box::new(move |store| {
            let _ = reply.send(f(store));
        });
        self.requests
            .send(job)
            .await
            .map_err(|_| Error::internal("the store has stopped"))?;
        Ok(Pending(answer))
    }
}

/// A queued store request's answer, to be awaited.
pub(crate) struct Pending<T>(oneshot::Receiver<Result<T>>);

impl<T> Pending<T> {
    pub(crate) async fn answer(self) -> Result<T> {
        self.0
            .await
            .map_err(|_| Error::internal("the store stopped before answering"))?
    }
}
