//! The publisher thread: it owns the PUB socket and the replay socket, numbers each batch,
//! keeps the last `replay_window` of them, and answers replay requests. The engine only puts
//! batches on a bounded queue ([`Publisher::publish`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::wire::{encode_batch, KvEvent};

/// Where to publish, and how much to keep for replays.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// The PUB socket's endpoint, e.g. `tcp://*:5557` (`tcp://127.0.0.1:0`: a free port).
    pub endpoint: String,
    /// The replay (ROUTER) socket's endpoint, e.g. `tcp://*:5558`; none: no replays.
    pub replay_endpoint: Option<String>,
    /// Batches kept for replays (vLLM keeps 10,000 steps).
    pub replay_window: usize,
}

impl PublisherConfig {
    /// Batches the engine may have queued before the publisher thread takes them; beyond that a
    /// batch is dropped rather than the step held.
    pub const QUEUE: usize = 1024;
}

/// The endpoints the sockets were bound to, ports resolved.
#[derive(Clone, Debug)]
pub struct Bound {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
}

/// A handle on the publisher thread; clones share it. The thread ends when the last is dropped.
#[derive(Clone, Debug)]
pub struct Publisher {
    queue: mpsc::Sender<Outgoing>,
    dropped: Arc<AtomicU64>,
}

#[derive(Debug)]
struct Outgoing {
    topic: Arc<str>,
    timestamp: f64,
    events: Vec<KvEvent>,
}

/// The sequence number vLLM's replay answer ends with (-1 as a signed 8-byte integer).
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

impl Publisher {
    /// Binds the sockets on a thread of their own; fails when an endpoint cannot be bound.
    pub fn start(config: PublisherConfig) -> std::io::Result<(Self, Bound)> {
        let (queue, batches) = mpsc::channel(PublisherConfig::QUEUE);
        let (bound_tx, bound_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new().name("spindle-kv-events".into()).spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = bound_tx.send(Err(e));
                    return;
                }
            };
            runtime.block_on(async move {
                match Sockets::bind(&config).await {
                    Ok((sockets, bound)) => {
                        let _ = bound_tx.send(Ok(bound));
                        sockets.run(batches, config.replay_window.max(1)).await;
                    }
                    Err(e) => {
                        let _ = bound_tx.send(Err(e));
                    }
                }
            });
        })?;
        let bound = bound_rx
            .recv()
            .map_err(|_| std::io::Error::other("the KV-events thread ended before binding"))??;
        Ok((Self { queue, dropped: Arc::default() }, bound))
    }

    /// Queues one engine step's events under `topic`; never waits. A full queue drops them.
    pub fn publish(&self, topic: &Arc<str>, events: Vec<KvEvent>) {
        if events.is_empty() {
            return;
        }
        let timestamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let outgoing = Outgoing { topic: topic.clone(), timestamp, events };
        if self.queue.try_send(outgoing).is_err() {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "KV-cache events dropped: the publisher falls behind");
            }
        }
    }

    /// Batches dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

struct Sockets {
    publish: PubSocket,
    replay: Option<RouterSocket>,
}

impl Sockets {
    async fn bind(config: &PublisherConfig) -> std::io::Result<(Self, Bound)> {
        let failed = |endpoint: &str, e: zeromq::ZmqError| {
            std::io::Error::other(format!("cannot bind the KV-events socket {endpoint}: {e}"))
        };
        let mut publish = PubSocket::new();
        let endpoint =
            publish.bind(&config.endpoint).await.map_err(|e| failed(&config.endpoint, e))?;
        let (replay, replay_endpoint) = match &config.replay_endpoint {
            Some(wanted) => {
                let mut replay = RouterSocket::new();
                let bound = replay.bind(wanted).await.map_err(|e| failed(wanted, e))?;
                (Some(replay), Some(bound.to_string()))
            }
            None => (None, None),
        };
        let bound = Bound { endpoint: endpoint.to_string(), replay_endpoint };
        Ok((Self { publish, replay }, bound))
    }

    /// Publishes batches in order, numbering them from 0, and answers replay requests, until
    /// every [`Publisher`] is gone.
    async fn run(mut self, mut batches: mpsc::Receiver<Outgoing>, window: usize) {
        let mut kept: VecDeque<(u64, Bytes)> = VecDeque::with_capacity(window);
        let mut next_seq: u64 = 0;
        loop {
            tokio::select! {
                // Batches first: one the engine queued before a replay request is in its answer.
                biased;
                batch = batches.recv() => {
                    let Some(batch) = batch else { return };
                    let payload = Bytes::from(encode_batch(batch.timestamp, &batch.events));
                    let frames = vec![
                        Bytes::copy_from_slice(batch.topic.as_bytes()),
                        Bytes::copy_from_slice(&next_seq.to_be_bytes()),
                        payload.clone(),
                    ];
                    let message = ZmqMessage::try_from(frames).expect("three frames");
                    // Without subscribers the socket drops it; the replay window still has it.
                    if let Err(e) = self.publish.send(message).await {
                        tracing::debug!(error = %e, "a KV-events batch was not sent");
                    }
                    if kept.len() == window {
                        kept.pop_front();
                    }
                    kept.push_back((next_seq, payload));
                    next_seq += 1;
                }
                request = receive(&mut self.replay) => match request {
                    Ok(request) => replay(self.replay.as_mut().expect("it received"), request, &kept).await,
                    Err(e) => tracing::debug!(error = %e, "a KV-events replay request failed"),
                },
            }
        }
    }
}

/// The next replay request; never, without a replay socket.
async fn receive(replay: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match replay {
        Some(socket) => socket.recv().await,
        None => std::future::pending().await,
    }
}

/// Answers `[identity, "", start]` (a REQ client's framing; a DEALER may leave out the empty
/// frame) with every kept batch numbered `start` or later, then the end marker.
async fn replay(socket: &mut RouterSocket, request: ZmqMessage, kept: &VecDeque<(u64, Bytes)>) {
    let mut frames = request.into_vecdeque();
    let Some(identity) = frames.pop_front() else { return };
    let delimiter = frames.front().filter(|f| f.is_empty()).cloned();
    if delimiter.is_some() {
        frames.pop_front();
    }
    let Some(start) = frames.front().and_then(|f| <[u8; 8]>::try_from(f.as_ref()).ok()) else {
        tracing::debug!("a KV-events replay request without an 8-byte sequence number");
        return;
    };
    let start = u64::from_be_bytes(start);
    let answers = kept
        .iter()
        .filter(|(seq, _)| *seq >= start)
        .map(|(seq, payload)| (Bytes::copy_from_slice(&seq.to_be_bytes()), payload.clone()))
        .chain(std::iter::once((Bytes::from_static(&END_OF_REPLAY), Bytes::new())));
    for (seq, payload) in answers {
        let mut frames = vec![identity.clone()];
        frames.extend(delimiter.clone());
        frames.extend([seq, payload]);
        let message = ZmqMessage::try_from(frames).expect("frames");
        if let Err(e) = socket.send(message).await {
            tracing::debug!(error = %e, "a KV-events replay answer was not sent");
            return;
        }
    }
}
