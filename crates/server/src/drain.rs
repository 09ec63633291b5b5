//! The drain before the process exits: a router must stop sending new work here, and the work
//! already here must end as its clients expect. Once asked to stop, the server admits nothing
//! (`/health` and every new request answer 503 with `Retry-After`, so that vllm-router or a
//! gateway sends them to another replica), lets the requests in flight end within
//! `--shutdown-grace-seconds`, cancels those still running after it, and only then closes its
//! listener. The batch worker stops at once: a batch request it had started gets no result
//! line, so the batch runs it again when the server is back. What lives on disk (batch results,
//! the prefix cache's disk tier) is written when the engine and the state drop after this.

use std::time::Duration;

use tokio::time::Instant;

use crate::state::AppState;

/// How often the drain looks whether the requests in flight have ended.
const POLL: Duration = Duration::from_millis(50);

/// Stops admitting, then waits until the requests in flight have ended or `grace` has passed,
/// when it cancels those left (their clients get the cancelled request's end).
pub async fn drain(state: &AppState, grace: Duration) {
    state.admissions.close();
    let in_flight = state.admissions.admitted();
    tracing::info!(in_flight, grace_seconds = grace.as_secs_f64(), "draining: admitting nothing");
    let deadline = Instant::now() + grace;
    while state.admissions.admitted() > 0 {
        if Instant::now() >= deadline {
            let cancelled = state.admissions.cancel_all();
            tracing::warn!(cancelled, "the grace period ended: requests still in flight cancelled");
            return;
        }
        tokio::time::sleep(POLL).await;
    }
    tracing::info!("drained: every request in flight has ended");
}

/// Whether the server drains (it answers `/health` with 503 then).
pub fn draining(state: &AppState) -> bool {
    state.admissions.is_closed()
}
