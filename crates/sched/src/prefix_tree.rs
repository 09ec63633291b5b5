//! The prefix cache: a radix tree over token blocks, so that a new prompt resumes from the cached
//! prefix of an earlier one instead of computing it again. Mirrors SGLang's
//! `mem_cache/radix_cache.py` (one node per run of tokens, LRU eviction of unlocked leaves) and
//! `mamba_radix_cache.py` (a hybrid model resumes only where a recurrent-state snapshot was taken).
//!
//! ```text
//!  block_size 4                      root
//!                            /                  \
//!  positions 0..4   full "a b c d" (block 0)   partial "a b" (block 5, snapshot at 2)
//!                     /            \
//!  positions 4..8   full "e f g h"   partial "e f" (snapshot at 6)
//!                   (block 1)        (block 1 again: see below)
//! ```
//!
//! Every node also carries a chunking key ([`crate::PrefillPlan::block_key`]): the keys and
//! values of a block depend on how the prompt that computed it was cut into prefill chunks, so
//! two blocks are the same only when their tokens and their keys are equal. A lookup follows a
//! node only under the key the looking prompt would compute the block with; a prompt cut
//! otherwise adds a sibling with the same tokens and its own blocks.
//!
//! Invariants (checked by `PrefixTree::check_invariants` in the tests):
//! - A node covers positions `start..start + tokens.len()`, `start` a multiple of `block_size`,
//!   `1 <= tokens.len() <= block_size`. Only full nodes (`tokens.len() == block_size`) have
//!   children, and a child starts where its parent ends.
//! - Siblings never hold identical tokens under equal keys (insert follows such a child instead
//!   of adding one), but may share leading tokens: a partial node can be a prefix of a full
//!   sibling, and partial siblings can have different lengths. Matching therefore compares whole
//!   token runs.
//! - The tree holds one pool reference per node on that node's block. Two nodes may name the same
//!   block: a sequence's last block is adopted as a partial node, the sequence keeps writing into
//!   it, and later the same block is adopted again as the full node.
//! - At most one snapshot per node; snapshot bytes stay within the budget.
//! - In hybrid mode every leaf holds a snapshot: a leaf without one could never be resumed from.
//!
//! Snapshots are opaque: the runner owns their payload; the tree only places them and reports the
//! ones it drops so that the runner can free them.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::block_pool::{BlockId, BlockPool};

/// Names a snapshot whose payload the runner keeps (recurrent state, or final-prompt logits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SnapshotId(pub u64);

/// Which positions of a cached prefix a prompt can resume from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheKind {
    /// Every layer is attention: the KV of positions `0..p` is all a resume at `p` needs, so any
    /// cached position will do.
    AttentionOnly,
    /// Some layers carry a recurrent state that cannot be rewound: a resume at `p` also needs a
    /// snapshot of that state taken at exactly `p`.
    Hybrid,
}

/// Index of a node in the tree's storage; freed indices are reused lowest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

/// A place a prompt can resume from.
///
/// The blocks are held by the tree only: share them (`BlockPool::share`) before anything can
/// evict them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumePoint {
    /// `tokens[0..position]` are cached.
    pub position: usize,
    /// The full blocks covering `0..position / block_size * block_size`, in order.
    pub blocks: Vec<BlockId>,
    /// When `position` is mid-block: the block holding `position / block_size * block_size..position`.
    /// Copy those positions into a block of your own before writing, because whoever wrote this
    /// block may keep writing past them.
    pub partial: Option<BlockId>,
    pub snapshot: Option<SnapshotId>,
}

/// What [`PrefixTree::insert`] did with the offered snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Inserted {
    /// False when the final node already had a snapshot or the new one alone exceeds the
    /// budget; the caller then drops its payload.
    pub snapshot_stored: bool,
    /// When the offered snapshot was not stored: the one the final node already holds.
    pub existing: Option<SnapshotId>,
    /// Older snapshots dropped to stay within the budget; the runner frees their payloads.
    pub dropped_snapshots: Vec<SnapshotId>,
}

/// A full block entering or leaving the tree, in the order they did, for the KV-cache events a
/// router reads ([`PrefixTree::take_changes`]). Partial nodes are left out: a block is known to
/// others only once it is full, as vLLM hashes only full blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockChange {
    /// A full node was added under `parent` (`None`: a first block), holding `tokens`.
    Stored { node: NodeId, parent: Option<NodeId>, tokens: Vec<u32> },
    /// A full node left (evicted, or pruned with a snapshot it led to).
    Removed { node: NodeId },
}

/// A read-only view of one node, for metrics and tests.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub id: NodeId,
    pub parent: Option<NodeId>,
    pub start: usize,
    pub tokens: &'a [u32],
    /// The chunking key the block was computed under.
    pub key: u64,
    pub block: BlockId,
    pub snapshot: Option<SnapshotId>,
    pub last_used: u64,
}

struct Node {
    parent: Option<NodeId>,
    start: usize,
    tokens: Vec<u32>,
    key: u64,
    block: BlockId,
    snapshot: Option<Snapshot>,
    last_used: u64,
    children: Vec<NodeId>,
}

#[derive(Clone, Copy)]
struct Snapshot {
    id: SnapshotId,
    bytes: usize,
}

/// A resume point found during a lookup, before its blocks are gathered.
struct Found {
    /// How many full nodes of the matched path lie before `position`.
    depth: usize,
    /// The node holding the positions past the last full node, if any.
    tail: Option<NodeId>,
    position: usize,
    snapshot: Option<SnapshotId>,
}

pub struct PrefixTree {
    block_size: usize,
    kind: CacheKind,
    snapshot_budget_bytes: usize,
    slots: Vec<Option<Node>>,
    free_slots: BTreeSet<u32>,
    roots: Vec<NodeId>,
    /// Tree references per block, to tell whether anyone outside the tree holds a block.
    block_refs: BTreeMap<BlockId, u32>,
    snapshot_bytes: usize,
    /// Ticks once per lookup or insert; `last_used` is the tick of the last one that touched a
    /// node, so LRU order is deterministic (ties go to the lowest node id).
    clock: u64,
    /// Full blocks added and removed since the last [`Self::take_changes`]; `None` until
    /// [`Self::journal_changes`] (nobody reads them, so nothing is copied).
    changes: Option<Vec<BlockChange>>,
}

impl PrefixTree {
    pub fn new(block_size: usize, kind: CacheKind, snapshot_budget_bytes: usize) -> Self {
        assert!(block_size > 0, "blocks hold at least one position");
        Self {
            block_size,
            kind,
            snapshot_budget_bytes,
            slots: Vec::new(),
            free_slots: BTreeSet::new(),
            roots: Vec::new(),
            block_refs: BTreeMap::new(),
            snapshot_bytes: 0,
            clock: 0,
            changes: None,
        }
    }

    /// From now on, the tree keeps the full blocks added and removed for [`Self::take_changes`].
    pub fn journal_changes(&mut self) {
        self.changes.get_or_insert_with(Vec::new);
    }

    /// The full blocks added and removed since the last call, in order. The engine takes them
    /// after every step, so they never pile up.
    pub fn take_changes(&mut self) -> Vec<BlockChange> {
        self.changes.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Places where `tokens` can resume, deepest first, all at positions `1..=tokens.len()`:
    /// every snapshot on the matched path and, in attention-only mode, the longest token match.
    /// Touches the nodes on the paths of the returned points.
    ///
    /// `key_at(end)` is the chunking key under which the prompt computes positions `0..end`
    /// ([`crate::PrefillPlan::block_key`]); it is asked for the end of each block and for the
    /// ends of partial nodes. A node ending at `end` is followed only when it holds that key. The
    /// longest token match considers only nodes holding the key of the prompt's own block there
    /// (ending at the block's end, or at the prompt's end within it).
    pub fn lookup(&mut self, tokens: &[u32], key_at: impl Fn(usize) -> u64) -> Vec<ResumePoint> {
        self.clock += 1;
        let bs = self.block_size;
        let mut full_path: Vec<NodeId> = Vec::new();
        let mut found: Vec<Found> = Vec::new();
        loop {
            let depth = full_path.len();
            let base = depth * bs;
            let rest = &tokens[base..];
            let siblings = self.children(full_path.last().copied());
            for &id in siblings {
                let node = self.node(id);
                let position = base + node.tokens.len();
                if node.tokens.len() < bs
                    && rest.starts_with(&node.tokens)
                    && node.key == key_at(position)
                {
                    if let Some(s) = node.snapshot {
                        found.push(Found { depth, tail: Some(id), position, snapshot: Some(s.id) });
                    }
                }
            }
            let full_match = siblings.iter().copied().find(|&id| {
                let node = self.node(id);
                node.tokens.len() == bs
                    && rest.starts_with(&node.tokens)
                    && node.key == key_at(base + bs)
            });
            if let Some(id) = full_match {
                full_path.push(id);
                if let Some(s) = self.node(id).snapshot {
                    let position = base + bs;
                    found.push(Found {
                        depth: depth + 1,
                        tail: None,
                        position,
                        snapshot: Some(s.id),
                    });
                }
                continue;
            }
            if self.kind == CacheKind::AttentionOnly {
                // The key of the prompt's own block here (none past the end of the prompt).
                let key = (!rest.is_empty()).then(|| key_at(base + rest.len().min(bs)));
                let longest = self.longest_match(siblings, rest, depth, key);
                // A snapshot point at the same position already carries these positions.
                if longest.position > 0 && found.iter().all(|f| f.position != longest.position) {
                    found.push(longest);
                }
            }
            break;
        }
        found.sort_by_key(|f| Reverse(f.position));
        self.resume_points(&full_path, found)
    }

    /// Records that positions `0..tokens.len()` of a sequence are held in `blocks`
    /// (`blocks.len() == tokens.len().div_ceil(block_size)`), computed under the chunking keys
    /// `keys` (one per block, the last for the block ending at `tokens.len()`), and offers a
    /// snapshot taken at `tokens.len()`. Blocks already cached under identical tokens and key
    /// are kept; the others are adopted (the tree takes its own reference).
    pub fn insert(
        &mut self,
        tokens: &[u32],
        keys: &[u64],
        blocks: &[BlockId],
        snapshot: Option<(SnapshotId, usize)>,
        pool: &mut BlockPool,
    ) -> Inserted {
        let bs = self.block_size;
        assert_eq!(blocks.len(), tokens.len().div_ceil(bs), "one block per {bs} positions");
        assert_eq!(keys.len(), blocks.len(), "one key per block");
        debug_assert_eq!(pool.block_size(), bs, "the tree and the pool agree on block size");
        self.clock += 1;
        let mut last = None;
        for (index, ((run, &block), &key)) in tokens.chunks(bs).zip(blocks).zip(keys).enumerate() {
            let existing = self.children(last).iter().copied().find(|&id| {
                let node = self.node(id);
                node.tokens == run && node.key == key
            });
            let id =
                existing.unwrap_or_else(|| self.add_node(last, index * bs, run, key, block, pool));
            self.node_mut(id).last_used = self.clock;
            last = Some(id);
        }
        let mut inserted =
            Inserted { snapshot_stored: false, existing: None, dropped_snapshots: Vec::new() };
        let Some(last) = last else { return inserted };
        if let Some((id, bytes)) = snapshot {
            inserted.existing = self.node(last).snapshot.map(|s| s.id);
            if inserted.existing.is_none() && bytes <= self.snapshot_budget_bytes {
                self.node_mut(last).snapshot = Some(Snapshot { id, bytes });
                self.snapshot_bytes += bytes;
                inserted.snapshot_stored = true;
                inserted.dropped_snapshots = self.enforce_snapshot_budget(last, pool);
            }
        }
        self.prune_useless(Some(last), pool);
        inserted
    }

    /// Changes the size of the held snapshot `id` (its payload grew or shrank), dropping least
    /// recently used others to stay within the budget; returns those, or `None` (and changes
    /// nothing) when `id` is not held or `bytes` alone exceed the budget.
    pub fn resize_snapshot(
        &mut self,
        id: SnapshotId,
        bytes: usize,
        pool: &mut BlockPool,
    ) -> Option<Vec<SnapshotId>> {
        if bytes > self.snapshot_budget_bytes {
            return None;
        }
        let node = self.live_ids().find(|&n| self.node(n).snapshot.is_some_and(|s| s.id == id))?;
        let snapshot = self.node_mut(node).snapshot.as_mut().expect("found by its snapshot");
        let old = std::mem::replace(&mut snapshot.bytes, bytes);
        self.snapshot_bytes = self.snapshot_bytes - old + bytes;
        Some(self.enforce_snapshot_budget(node, pool))
    }

    /// Drops least recently used leaves (then lowest id) until `pool.free_blocks() >= needed` or
    /// nothing more can go, and returns the snapshots dropped with them. Only a leaf whose block
    /// nobody outside the tree holds is dropped: any other would free no memory. (A block the
    /// tree names twice, from a partial node and its full sibling, goes with the second node.)
    pub fn make_room(&mut self, pool: &mut BlockPool, needed: usize) -> Vec<SnapshotId> {
        let mut dropped = Vec::new();
        // Eligibility only changes for a parent whose last child goes: holders outside the
        // tree do not change while we drop tree references.
        let mut candidates: BTreeSet<(u64, NodeId)> = self
            .live_ids()
            .filter(|&id| self.is_evictable(id, pool))
            .map(|id| (self.node(id).last_used, id))
            .collect();
        while pool.free_blocks() < needed {
            let Some((_, victim)) = candidates.pop_first() else {
                break;
            };
            let node = self.remove_leaf(victim, pool);
            dropped.extend(node.snapshot.map(|s| s.id));
            if let Some(parent) = self.prune_useless(node.parent, pool) {
                if self.is_evictable(parent, pool) {
                    candidates.insert((self.node(parent).last_used, parent));
                }
            }
        }
        dropped
    }

    pub fn kind(&self) -> CacheKind {
        self.kind
    }

    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }

    /// Every node, lowest id first.
    pub fn nodes(&self) -> impl Iterator<Item = NodeView<'_>> {
        self.live_ids().map(|id| {
            let node = self.node(id);
            NodeView {
                id,
                parent: node.parent,
                start: node.start,
                tokens: &node.tokens,
                key: node.key,
                block: node.block,
                snapshot: node.snapshot.map(|s| s.id),
                last_used: node.last_used,
            }
        })
    }

    /// The snapshots held, in id order.
    pub fn snapshots(&self) -> Vec<SnapshotId> {
        let mut ids: Vec<SnapshotId> = self.nodes().filter_map(|n| n.snapshot).collect();
        ids.sort_unstable();
        ids
    }

    pub fn snapshot_bytes(&self) -> usize {
        self.snapshot_bytes
    }

    /// Panics with a description if an invariant of the module doc is broken, or if the pool
    /// counts fewer holders of a block than the tree's own references to it.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self, pool: &BlockPool) {
        let bs = self.block_size;
        let mut refs: BTreeMap<BlockId, u32> = BTreeMap::new();
        let mut bytes = 0;
        for id in self.live_ids() {
            let node = self.node(id);
            let len = node.tokens.len();
            assert!(
                node.start.is_multiple_of(bs) && (1..=bs).contains(&len),
                "node {id:?} covers a bad run"
            );
            assert!(len == bs || node.children.is_empty(), "partial node {id:?} has children");
            let parent_end = node.parent.map_or(0, |p| self.node(p).start + bs);
            assert_eq!(node.start, parent_end, "node {id:?} does not start where its parent ends");
            assert!(
                self.children(node.parent).contains(&id),
                "node {id:?} is not its parent's child"
            );
            assert!(node.last_used <= self.clock, "node {id:?} was used in the future");
            for &child in &node.children {
                assert_eq!(
                    self.node(child).parent,
                    Some(id),
                    "child {child:?} names another parent"
                );
            }
            *refs.entry(node.block).or_insert(0) += 1;
            bytes += node.snapshot.map_or(0, |s| s.bytes);
            if self.kind == CacheKind::Hybrid && node.children.is_empty() {
                assert!(node.snapshot.is_some(), "hybrid leaf {id:?} has no snapshot");
            }
        }
        for parent in std::iter::once(None).chain(self.live_ids().map(Some)) {
            let siblings = self.children(parent);
            for (i, &a) in siblings.iter().enumerate() {
                for &b in &siblings[i + 1..] {
                    let (a_node, b_node) = (self.node(a), self.node(b));
                    let same = a_node.tokens == b_node.tokens && a_node.key == b_node.key;
                    assert!(
                        !same,
                        "siblings {a:?} and {b:?} hold the same tokens under the same key"
                    );
                }
            }
        }
        assert_eq!(refs, self.block_refs, "block reference counts drifted");
        for (&block, &count) in &refs {
            assert!(pool.holders(block) >= count, "the pool lost holders of {block:?}");
        }
        assert_eq!(bytes, self.snapshot_bytes, "snapshot bytes drifted");
        assert!(bytes <= self.snapshot_budget_bytes, "snapshots exceed their budget");
    }

    /// Among `siblings` holding `key`, the node sharing the most leading tokens with `rest`
    /// (lowest id on a tie); without one, the end of the full path.
    fn longest_match(
        &self,
        siblings: &[NodeId],
        rest: &[u32],
        depth: usize,
        key: Option<u64>,
    ) -> Found {
        let base = depth * self.block_size;
        let best = siblings
            .iter()
            .filter(|&&id| Some(self.node(id).key) == key)
            .map(|&id| (common_prefix_len(&self.node(id).tokens, rest), id))
            .filter(|&(matched, _)| matched > 0)
            .max_by_key(|&(matched, id)| (matched, Reverse(id)));
        match best {
            Some((matched, id)) => {
                debug_assert!(matched < self.block_size, "a whole block match is a full path step");
                Found { depth, tail: Some(id), position: base + matched, snapshot: None }
            }
            None => Found { depth, tail: None, position: base, snapshot: None },
        }
    }

    /// Touches the nodes on the paths of `found` and gathers their blocks.
    fn resume_points(&mut self, full_path: &[NodeId], found: Vec<Found>) -> Vec<ResumePoint> {
        let deepest = found.iter().map(|f| f.depth).max().unwrap_or(0);
        let touched =
            full_path[..deepest].iter().copied().chain(found.iter().filter_map(|f| f.tail));
        for id in touched.collect::<Vec<_>>() {
            self.node_mut(id).last_used = self.clock;
        }
        found
            .into_iter()
            .map(|f| ResumePoint {
                position: f.position,
                blocks: full_path[..f.depth].iter().map(|&id| self.node(id).block).collect(),
                partial: f.tail.map(|id| self.node(id).block),
                snapshot: f.snapshot,
            })
            .collect()
    }

    /// Drops the least recently used snapshots other than `keep`'s until the budget holds. A
    /// lookup touches every snapshot on its path, so a conversation's snapshots are equally
    /// recent: among those the shallowest (its oldest turns) go first, so that each live
    /// conversation keeps its most recent ones longest.
    fn enforce_snapshot_budget(&mut self, keep: NodeId, pool: &mut BlockPool) -> Vec<SnapshotId> {
        let mut dropped = Vec::new();
        if self.snapshot_bytes <= self.snapshot_budget_bytes {
            return dropped;
        }
        let mut victims: Vec<(u64, usize, NodeId)> = self
            .live_ids()
            .filter(|&id| id != keep && self.node(id).snapshot.is_some())
            .map(|id| (self.node(id).last_used, self.node(id).start, id))
            .collect();
        victims.sort_unstable();
        for (_, _, id) in victims {
            if self.snapshot_bytes <= self.snapshot_budget_bytes {
                break;
            }
            let snapshot = self.node_mut(id).snapshot.take().expect("victims hold snapshots");
            self.snapshot_bytes -= snapshot.bytes;
            dropped.push(snapshot.id);
            self.prune_useless(Some(id), pool);
        }
        dropped
    }

    /// In hybrid mode, drops snapshot-less leaves from `from` upward. Returns the first node
    /// that stays (None: the walk reached the root).
    fn prune_useless(&mut self, from: Option<NodeId>, pool: &mut BlockPool) -> Option<NodeId> {
        let mut at = from;
        while let Some(id) = at {
            let node = self.node(id);
            if self.kind == CacheKind::AttentionOnly
                || !node.children.is_empty()
                || node.snapshot.is_some()
            {
                break;
            }
            at = self.remove_leaf(id, pool).parent;
        }
        at
    }

    fn is_evictable(&self, id: NodeId, pool: &BlockPool) -> bool {
        let node = self.node(id);
        node.children.is_empty() && pool.holders(node.block) == self.block_refs[&node.block]
    }

    fn add_node(
        &mut self,
        parent: Option<NodeId>,
        start: usize,
        tokens: &[u32],
        key: u64,
        block: BlockId,
        pool: &mut BlockPool,
    ) -> NodeId {
        pool.share(&[block]);
        *self.block_refs.entry(block).or_insert(0) += 1;
        let full = tokens.len() == self.block_size;
        let node = Node {
            parent,
            start,
            tokens: tokens.to_vec(),
            key,
            block,
            snapshot: None,
            last_used: self.clock,
            children: Vec::new(),
        };
        let id = match self.free_slots.pop_first() {
            Some(slot) => {
                self.slots[slot as usize] = Some(node);
                NodeId(slot)
            }
            None => {
                self.slots.push(Some(node));
                NodeId(self.slots.len() as u32 - 1)
            }
        };
        self.children_mut(parent).push(id);
        if let Some(changes) = self.changes.as_mut().filter(|_| full) {
            changes.push(BlockChange::Stored { node: id, parent, tokens: tokens.to_vec() });
        }
        id
    }

    /// Unlinks a childless node, releases the tree's reference on its block and frees its slot.
    fn remove_leaf(&mut self, id: NodeId, pool: &mut BlockPool) -> Node {
        let node = self.slots[id.0 as usize].take().expect("removing a live node");
        debug_assert!(node.children.is_empty(), "only leaves are removed");
        self.children_mut(node.parent).retain(|&child| child != id);
        pool.release(&[node.block]);
        let refs = self.block_refs.get_mut(&node.block).expect("the tree holds its nodes' blocks");
        *refs -= 1;
        if *refs == 0 {
            self.block_refs.remove(&node.block);
        }
        self.snapshot_bytes -= node.snapshot.map_or(0, |s| s.bytes);
        self.free_slots.insert(id.0);
        if let Some(changes) =
            self.changes.as_mut().filter(|_| node.tokens.len() == self.block_size)
        {
            changes.push(BlockChange::Removed { node: id });
        }
        node
    }

    fn live_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.is_some())
            .map(|(i, _)| NodeId(i as u32))
    }

    fn children(&self, parent: Option<NodeId>) -> &[NodeId] {
        match parent {
            Some(id) => &self.node(id).children,
            None => &self.roots,
        }
    }

    fn children_mut(&mut self, parent: Option<NodeId>) -> &mut Vec<NodeId> {
        match parent {
            Some(id) => &mut self.node_mut(id).children,
            None => &mut self.roots,
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        self.slots[id.0 as usize].as_ref().expect("a live node")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.slots[id.0 as usize].as_mut().expect("a live node")
    }
}

fn common_prefix_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod random_tests;
#[cfg(test)]
mod tests;
