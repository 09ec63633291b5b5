//! The prefix cache's blocks as KV-cache events for a router (see `spindle-kv-events`): each
//! engine step's full blocks that entered or left the prefix tree become one batch of
//! `BlockStored` / `BlockRemoved`, and a cache dropped after a fault an `AllBlocksCleared`.
//!
//! A block's hash chains its parent's hash with its 16 token ids, so it names the token path,
//! not the storage: the tree may hold the same path twice (on a hybrid model, under two
//! chunkings), and the router is told of it once, when the first copy comes, and of its
//! removal when the last goes. On a hybrid model every block the tree keeps lies on the way to
//! a recurrent-state snapshot (the tree drops the others), so every reported block leads to a
//! place a prompt can resume from; see the README for what a router can infer from that.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use spindle_kv_events::{BlockHash, KvEvent, Medium, Publisher};
use spindle_sched::{BlockChange, NodeId};

/// Where a model's events go: the process's publisher, under the model's topic.
#[derive(Clone, Debug)]
pub struct KvEventsOut {
    pub publisher: Publisher,
    /// This replica's address as routers know it (`host:port`), the topic's middle part.
    pub pod: Arc<str>,
    /// `kv@<pod>@<model>`, as llm-d's subscriber parses it.
    pub topic: Arc<str>,
}

impl KvEventsOut {
    pub fn new(publisher: Publisher, pod: &str) -> Self {
        Self { publisher, pod: pod.into(), topic: format!("kv@{pod}@").into() }
    }

    /// The same publisher under `model`'s topic.
    pub fn for_model(&self, model: &str) -> Self {
        Self { topic: format!("kv@{}@{model}", self.pod).into(), ..self.clone() }
    }
}

/// Turns the tree's block changes into events, and publishes them when there is somewhere to.
pub struct BlockEvents {
    out: Option<KvEventsOut>,
    block_size: usize,
    /// The hash of each full node the tree holds.
    hashes: HashMap<NodeId, BlockHash>,
    /// Full nodes holding each hash: the router hears of a path once, however many hold it.
    holders: HashMap<BlockHash, u32>,
}

impl BlockEvents {
    pub fn new(out: Option<KvEventsOut>, block_size: usize) -> Self {
        Self { out, block_size, hashes: HashMap::new(), holders: HashMap::new() }
    }

    /// Publishes the events of `changes` as one batch (nothing when there are none, or nowhere
    /// to publish).
    pub fn publish(&mut self, changes: Vec<BlockChange>) {
        if self.out.is_none() || changes.is_empty() {
            return;
        }
        let events = self.events(changes);
        self.send(events);
    }

    /// The cache was dropped whole: forgets every block and says so.
    pub fn cleared(&mut self) {
        self.hashes.clear();
        self.holders.clear();
        self.send(vec![KvEvent::AllBlocksCleared]);
    }

    fn send(&self, events: Vec<KvEvent>) {
        if let Some(out) = &self.out {
            out.publisher.publish(&out.topic, events);
        }
    }

    /// The events `changes` make, in order; a run of blocks each the child of the one before
    /// is one `BlockStored`, as vLLM batches a sequence's blocks.
    pub fn events(&mut self, changes: Vec<BlockChange>) -> Vec<KvEvent> {
        let mut events: Vec<KvEvent> = Vec::new();
        for change in changes {
            match change {
                BlockChange::Stored { node, parent, tokens } => {
                    let parent_hash = parent.and_then(|p| self.hashes.get(&p).copied());
                    let hash = block_hash(parent_hash, &tokens);
                    self.hashes.insert(node, hash);
                    if hold(&mut self.holders, hash) {
                        let block = (hash, parent_hash, tokens);
                        push_stored(&mut events, block, self.block_size, Medium::Pool);
                    }
                }
                BlockChange::Removed { node } => {
                    let Some(hash) = self.hashes.remove(&node) else { continue };
                    if release(&mut self.holders, hash) {
                        push_removed(&mut events, hash, Medium::Pool);
                    }
                }
            }
        }
        events
    }

    /// The hashes of the blocks the tree holds now, as the events so far describe them.
    #[cfg(test)]
    pub fn held(&self) -> std::collections::BTreeSet<BlockHash> {
        self.holders.keys().copied().collect()
    }
}

/// Counts one more holder of `hash`; true for its first, which announces it.
pub(crate) fn hold(holders: &mut HashMap<BlockHash, u32>, hash: BlockHash) -> bool {
    let count = holders.entry(hash).or_insert(0);
    *count += 1;
    *count == 1
}

/// Counts one holder of `hash` fewer; true for its last, which removes it.
pub(crate) fn release(holders: &mut HashMap<BlockHash, u32>, hash: BlockHash) -> bool {
    let count = holders.get_mut(&hash).expect("a held hash is counted");
    *count -= 1;
    if *count > 0 {
        return false;
    }
    holders.remove(&hash);
    true
}

/// Appends block `(hash, parent, tokens)` as stored on `medium`: to the last event when that
/// is a `BlockStored` ending in its parent (vLLM sends a sequence's blocks as one event).
pub(crate) fn push_stored(
    events: &mut Vec<KvEvent>,
    (hash, parent, tokens): (BlockHash, Option<BlockHash>, Vec<u32>),
    block_size: usize,
    medium: Medium,
) {
    if let Some(KvEvent::BlockStored { hashes, token_ids, medium: last, .. }) = events.last_mut() {
        if *last == medium && parent.is_some() && hashes.last().copied() == parent {
            hashes.push(hash);
            token_ids.extend(tokens);
            return;
        }
    }
    events.push(KvEvent::BlockStored {
        hashes: vec![hash],
        parent,
        token_ids: tokens,
        block_size,
        medium,
    });
}

/// Appends `hash` as removed from `medium`, to the last event when that is a removal there.
pub(crate) fn push_removed(events: &mut Vec<KvEvent>, hash: BlockHash, medium: Medium) {
    match events.last_mut() {
        Some(KvEvent::BlockRemoved { hashes, medium: last }) if *last == medium => {
            hashes.push(hash)
        }
        _ => events.push(KvEvent::BlockRemoved { hashes: vec![hash], medium }),
    }
}

/// A block's hash: its parent's (none for a first block) chained with its token ids.
/// `DefaultHasher::new` has fixed keys, so a path hashes alike in every run of a build.
pub(crate) fn block_hash(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
    let mut hasher = std::hash::DefaultHasher::new();
    parent.hash(&mut hasher);
    tokens.hash(&mut hasher);
    hasher.finish()
}

#[cfg(test)]
mod tests;
