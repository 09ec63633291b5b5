//! What the engine reports about a sequence, and the bounded channel it travels on. A client
//! that reads slowly holds back its own sequence instead of piling its events up in memory:
//! the engine leaves a sequence out of a step while its channel has no room for what the step
//! could send, and goes on stepping the others; when nothing else can run it parks, and the
//! reader's side wakes it when it reads, closes or cancels.
//!
//! Outside a step a live sequence's channel always has room for its end: a step runs a
//! sequence only while [`STEP_EVENTS`] fit, and sends at most one event before the end;
//! progress reports, which the next one supersedes, are skipped rather than take that room.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;

use tokio::sync::mpsc::{self, error::TrySendError};

use crate::error::RunnerError;
use crate::output::TextDelta;
use crate::sampler::SampledToken;

/// Events a sequence's channel holds before the engine holds the sequence back: enough that a
/// client reading at its own pace never makes the engine wait, few enough to cost nothing.
pub const EVENT_CAPACITY: usize = 64;

/// Events one step of a sequence may send: a token, then its end.
const STEP_EVENTS: usize = 2;

/// What the engine reports about a sequence, in order: prompt progress, tokens, then one
/// `Finished` or `Failed`.
#[derive(Debug)]
pub enum SequenceEvent {
    /// A prefill chunk ran: `read` of the prompt's `total` positions are in the cache, `cached`
    /// of them taken from the prefix cache. Skipped while the client is behind.
    Prefilled {
        read: usize,
        total: usize,
        cached: usize,
    },
    Token {
        token: SampledToken,
        text: TextDelta,
        reasoning: bool,
    },
    Finished(SequenceSummary),
    Failed(RunnerError),
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token was sampled, or a stop string was produced.
    Stop,
    /// `max_tokens` or the context limit was reached.
    Length,
    /// The request was cancelled while running.
    Cancelled,
}

/// Counts reported when a sequence ends.
#[derive(Clone, Debug)]
pub struct SequenceSummary {
    pub finish_reason: FinishReason,
    /// Text that was held back (a possible stop-string or tag prefix) and is now released.
    pub tail: TextDelta,
    /// The request's stop string that ended the text (`finish_reason` is then `Stop`).
    pub stop_sequence: Option<String>,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub reasoning_tokens: usize,
    pub cached_tokens: usize,
    /// Tokens drafted for speculative rounds, and how many of them the model picked itself.
    pub drafted_tokens: usize,
    pub accepted_tokens: usize,
}

/// A new sequence's two ends: the [`Caller`] goes to the engine with the request, the
/// [`SequenceEvents`] stay with whoever reads them.
pub fn sequence_channel() -> (Caller, SequenceEvents) {
    let (sender, receiver) = mpsc::channel(EVENT_CAPACITY);
    let link = Arc::new(Link::default());
    (Caller { sender, link: link.clone() }, SequenceEvents { receiver, link })
}

/// What both ends share.
#[derive(Default)]
struct Link {
    cancelled: AtomicBool,
    /// The thread that waits for room: woken on every read, close or cancel.
    engine: OnceLock<Thread>,
}

impl Link {
    fn wake_engine(&self) {
        if let Some(engine) = self.engine.get() {
            engine.unpark();
        }
    }
}

/// The engine's end of a sequence: where its events go, and whether its client still wants
/// them.
pub struct Caller {
    sender: mpsc::Sender<SequenceEvent>,
    link: Arc<Link>,
}

/// The client is gone: nobody reads the sequence's events any more.
#[derive(Debug)]
pub struct ClientGone;

impl Caller {
    /// Makes every read, close or cancel on the other end unpark `engine` (once per sequence:
    /// a later thread is ignored), so an engine holding the sequence back can park meanwhile.
    pub fn wake_on_read(&self, engine: Thread) {
        let _ = self.link.engine.set(engine);
    }

    /// Whether the sequence may take a step: its channel has room for what a step sends, or
    /// its client is gone (and the step ends it). Checked after [`Self::wake_on_read`], a false
    /// here is always followed by an unpark once it may have turned true.
    pub fn ready(&self) -> bool {
        self.sender.capacity() >= STEP_EVENTS || self.client_gone()
    }

    /// Token events a step may send beyond the one token and end every step has room for
    /// (a speculative round's accepted drafts).
    pub fn spare_events(&self) -> usize {
        self.sender.capacity().saturating_sub(STEP_EVENTS)
    }

    /// The client went away or cancelled.
    pub fn client_gone(&self) -> bool {
        self.sender.is_closed() || self.link.cancelled.load(Ordering::SeqCst)
    }

    /// Whether the client dropped its end (a cancel leaves it open to hear of the end).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends a token or an end. A full channel cannot happen to an engine that steps a
    /// sequence only when [`Self::ready`]; if it does, the event is lost and the sequence
    /// should end as if its client had gone.
    pub fn send(&self, event: SequenceEvent) -> Result<(), ClientGone> {
        match self.sender.try_send(event) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(ClientGone),
            Err(TrySendError::Full(event)) => {
                tracing::error!(?event, "a sequence stepped without room for its events");
                Err(ClientGone)
            }
        }
    }

    /// Sends a progress report, unless it would take the room kept for the sequence's end.
    pub fn send_progress(&self, event: SequenceEvent) {
        if self.sender.capacity() >= STEP_EVENTS {
            let _ = self.sender.try_send(event);
        }
    }
}

/// The reader's end of a sequence. Dropping it tells the engine the client is gone.
pub struct SequenceEvents {
    receiver: mpsc::Receiver<SequenceEvent>,
    link: Arc<Link>,
}

impl SequenceEvents {
    /// The next event; `None` once the engine has dropped the sequence's [`Caller`].
    pub async fn recv(&mut self) -> Option<SequenceEvent> {
        let event = self.receiver.recv().await;
        self.link.wake_engine();
        event
    }

    /// [`Self::recv`] for a thread outside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<SequenceEvent> {
        let event = self.receiver.blocking_recv();
        self.link.wake_engine();
        event
    }

    /// Stops the sequence: the engine sends nothing more and frees what it holds.
    pub fn close(&mut self) {
        self.receiver.close();
        self.link.wake_engine();
    }

    /// A handle that cancels the sequence from elsewhere; its end is still reported here.
    pub fn canceller(&self) -> Canceller {
        Canceller(self.link.clone())
    }
}

impl Drop for SequenceEvents {
    fn drop(&mut self) {
        // Closed before the wake, so the woken engine sees the client gone.
        self.close();
    }
}

/// Cancels one sequence: it ends at its next step, reporting `FinishReason::Cancelled`.
#[derive(Clone)]
pub struct Canceller(Arc<Link>);

impl Canceller {
    pub fn cancel(&self) {
        self.0.cancelled.store(true, Ordering::SeqCst);
        self.0.wake_engine();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u32) -> SequenceEvent {
        let token = SampledToken { id, logprob: 0.0, top_logprobs: Vec::new() };
        SequenceEvent::Token { token, text: TextDelta::default(), reasoning: false }
    }

    #[test]
    fn a_full_channel_holds_the_sequence_back_and_keeps_room_for_its_end() {
        let (caller, mut events) = sequence_channel();
        let mut sent = 0;
        while caller.ready() {
            caller.send(token(0)).unwrap();
            sent += 1;
        }
        assert_eq!(sent, EVENT_CAPACITY - 1, "one place is kept for the end");
        caller.send_progress(SequenceEvent::Prefilled { read: 1, total: 1, cached: 0 });
        caller.send(SequenceEvent::Failed(RunnerError::EmptyPrompt)).unwrap();
        assert!(matches!(events.blocking_recv(), Some(SequenceEvent::Token { .. })));
        assert!(!caller.ready(), "one place read is less than a step needs");
        events.blocking_recv();
        assert!(caller.ready());
    }

    #[test]
    fn reading_closing_and_cancelling_wake_the_waiting_engine() {
        let (caller, mut events) = sequence_channel();
        caller.wake_on_read(std::thread::current());
        while caller.ready() {
            caller.send(token(0)).unwrap();
        }
        let reader = std::thread::spawn(move || {
            events.blocking_recv();
            events.blocking_recv();
            events
        });
        // A wake may come early (parking allows that); the loop checks again.
        while !caller.ready() {
            std::thread::park();
        }
        let events = reader.join().unwrap();
        assert!(!caller.client_gone());
        events.canceller().cancel();
        assert!(caller.client_gone() && !caller.is_closed(), "a cancelled client hears the end");
    }

    #[test]
    fn a_dropped_reader_is_a_client_gone() {
        let (caller, events) = sequence_channel();
        drop(events);
        assert!(caller.client_gone() && caller.is_closed() && caller.ready());
        assert!(caller.send(token(1)).is_err());
    }
}
