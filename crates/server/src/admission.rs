//! Admission: a live request takes a place among those in flight (running and waiting) or is
//! refused with a 429, a batch's request is never counted; every admitted request can be
//! cancelled by id until its ticket is dropped; and once the server drains, nothing more is
//! admitted (503, so that a router sends the request to another replica).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use spindle_api::ApiError;
use spindle_runner::Canceller;

/// The requests in flight.
pub struct Admissions {
    /// Live requests allowed in flight at once (`--max-concurrent` + `--max-queue`).
    limit: usize,
    in_flight: AtomicUsize,
    cancels: Mutex<HashMap<String, Canceller>>,
    /// Set once the server drains: every request is refused from then on.
    closed: AtomicBool,
}

/// Whom a request serves: a client waiting for it, or a batch filling idle capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    Live,
    /// Not counted against the live limit, so batch work never turns a client away with a
    /// 429; the batch worker limits itself instead.
    Batch,
}

impl Admissions {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            in_flight: AtomicUsize::new(0),
            cancels: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
        }
    }

    /// Admits nothing from now on; those admitted run on. Taken under the lock `admit` inserts
    /// under, so that a request is either counted by [`Self::admitted`] from now on or refused.
    pub fn close(&self) {
        let _cancels = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        self.closed.store(true, Ordering::Release);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Admitted requests not ended yet, live and batch.
    pub fn admitted(&self) -> usize {
        self.cancels.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Cancels every admitted request; returns how many there were.
    pub fn cancel_all(&self) -> usize {
        let cancels = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        cancels.values().for_each(Canceller::cancel);
        cancels.len()
    }

    /// Admits request `id`, or 429 for a live one when running and waiting requests are at
    /// their limit, or 503 once the server drains. The ticket keeps its place until dropped
    /// and makes the request cancellable.
    pub fn admit(
        self: &Arc<Self>,
        id: &str,
        cancel: Canceller,
        admission: Admission,
    ) -> Result<Ticket, ApiError> {
        let mut cancels = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        if self.is_closed() {
            return Err(ApiError::unavailable(
                "the server is shutting down; send the request to another replica",
            ));
        }
        if admission == Admission::Live {
            let limit = self.limit;
            let admitted = self
                .in_flight
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < limit).then_some(n + 1))
                .is_ok();
            if !admitted {
                return Err(ApiError::rate_limited(format!(
                    "the server is at its limit of {limit} requests in flight; retry shortly"
                )));
            }
        }
        cancels.insert(id.to_string(), cancel);
        Ok(Ticket { admissions: self.clone(), id: id.to_string(), admission })
    }

    /// Cancels request `id`; false when no such request is in flight.
    pub fn cancel(&self, id: &str) -> bool {
        let cancels = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        cancels.get(id).map(Canceller::cancel).is_some()
    }
}

/// A request's place in flight; dropping it (finished, failed or the client gone) frees it.
pub struct Ticket {
    admissions: Arc<Admissions>,
    id: String,
    admission: Admission,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.admission == Admission::Live {
            self.admissions.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
        self.admissions.cancels.lock().unwrap_or_else(|e| e.into_inner()).remove(&self.id);
    }
}
