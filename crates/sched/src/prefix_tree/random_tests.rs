//! Random sequences resume, grow, finish and get evicted against a naive model of what every
//! block holds and how it was computed, checking reference counts and resume points after every
//! operation.

use std::collections::BTreeMap;

use super::*;

const BLOCK_SIZE: usize = 4;
const POOL_BLOCKS: usize = 24;
const SNAPSHOT_BUDGET: usize = 100;
const MAX_LIVE: usize = 6;
/// Prompts start with a prefix of one of these, so that they share blocks and partial runs.
const STEMS: [[u32; 10]; 3] = [
    [1, 2, 3, 1, 2, 3, 1, 2, 3, 1],
    [1, 2, 3, 1, 3, 3, 2, 1, 1, 2],
    [2, 2, 1, 3, 1, 1, 2, 3, 3, 2],
];

/// Ways to cut prompts into chunks: 0 and 1 compute positions up to 6 alike, 2 nothing like the
/// others.
const CHUNKINGS: u64 = 3;

/// The chunking key of the block ending at `end` under `chunking`.
fn key(chunking: u64, end: usize) -> u64 {
    let group = match chunking {
        1 if end <= 6 => 0,
        c => c,
    };
    group << 32 | end as u64
}

/// Marsaglia's xorshift64: deterministic and dependency-free.
struct XorShift(u64);

impl XorShift {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

struct Sequence {
    tokens: Vec<u32>,
    blocks: Vec<BlockId>,
    chunking: u64,
}

impl Sequence {
    fn keys(&self) -> Vec<u64> {
        (1..=self.blocks.len())
            .map(|i| key(self.chunking, (i * BLOCK_SIZE).min(self.tokens.len())))
            .collect()
    }
}

struct World {
    rng: XorShift,
    pool: BlockPool,
    tree: PrefixTree,
    /// The token written at each position of each block: what the KV there was computed from.
    contents: Vec<Vec<u32>>,
    /// The chunking of the sequence that wrote each block.
    writers: Vec<u64>,
    /// The snapshots the tree should hold, with the tokens each was taken after and the
    /// chunking of the sequence that took it.
    snapshots: BTreeMap<SnapshotId, (Vec<u32>, u64)>,
    live: Vec<Sequence>,
    next_snapshot: u64,
}

impl World {
    fn new(kind: CacheKind, seed: u64) -> Self {
        Self {
            rng: XorShift(seed),
            pool: BlockPool::new(POOL_BLOCKS, BLOCK_SIZE),
            tree: PrefixTree::new(BLOCK_SIZE, kind, SNAPSHOT_BUDGET),
            contents: vec![Vec::new(); POOL_BLOCKS],
            writers: vec![0; POOL_BLOCKS],
            snapshots: BTreeMap::new(),
            live: Vec::new(),
            next_snapshot: 0,
        }
    }

    fn random_prompt(&mut self) -> Vec<u32> {
        let stem = STEMS[self.rng.below(STEMS.len())];
        let mut tokens = stem[..self.rng.below(stem.len() + 1)].to_vec();
        for _ in 0..self.rng.below(4) {
            tokens.push(1 + self.rng.below(3) as u32);
        }
        tokens
    }

    fn step(&mut self) {
        match self.rng.below(10) {
            0..=3 if self.live.len() < MAX_LIVE => self.start_sequence(),
            0..=5 if !self.live.is_empty() => self.grow_sequence(),
            0..=7 if !self.live.is_empty() => {
                let done = self.live.swap_remove(self.rng.below(self.live.len()));
                self.pool.release(&done.blocks);
            }
            8 => {
                let needed = self.rng.below(POOL_BLOCKS + 1);
                let dropped = self.tree.make_room(&mut self.pool, needed);
                self.forget_snapshots(&dropped);
            }
            _ => {
                let prompt = self.random_prompt();
                let chunking = self.rng.below(CHUNKINGS as usize) as u64;
                self.lookup_and_check(&prompt, chunking);
            }
        }
        self.check();
    }

    /// Resumes a random prompt from a random returned point, as the engine would.
    fn start_sequence(&mut self) {
        let tokens = self.random_prompt();
        let chunking = self.rng.below(CHUNKINGS as usize) as u64;
        let points = self.lookup_and_check(&tokens, chunking);
        let mut blocks = Vec::new();
        let mut resumed = Vec::new();
        if !points.is_empty() {
            let point = &points[self.rng.below(points.len())];
            self.pool.share(&point.blocks);
            blocks = point.blocks.clone();
            if let Some(partial) = point.partial {
                resumed = self.contents[partial.0 as usize][..point.position % BLOCK_SIZE].to_vec();
            }
        }
        let resume_at = blocks.len() * BLOCK_SIZE + resumed.len();
        let mut sequence =
            Sequence { tokens: tokens[..blocks.len() * BLOCK_SIZE].to_vec(), blocks, chunking };
        // A resumed partial block is copied into the sequence's own first new block.
        let copied = self.extend(&mut sequence, &resumed);
        if !copied || !self.extend(&mut sequence, &tokens[resume_at..]) {
            self.pool.release(&sequence.blocks);
            return;
        }
        self.insert(&sequence);
        self.live.push(sequence);
    }

    fn grow_sequence(&mut self) {
        let index = self.rng.below(self.live.len());
        let mut sequence = std::mem::replace(
            &mut self.live[index],
            Sequence { tokens: vec![], blocks: vec![], chunking: 0 },
        );
        let more: Vec<u32> =
            (0..1 + self.rng.below(5)).map(|_| 1 + self.rng.below(3) as u32).collect();
        if self.extend(&mut sequence, &more) {
            self.insert(&sequence);
        }
        self.live[index] = sequence;
    }

    /// Writes `more` after the sequence's tokens, allocating blocks (making room) as needed;
    /// false when the pool cannot hold them.
    fn extend(&mut self, sequence: &mut Sequence, more: &[u32]) -> bool {
        let needed =
            (sequence.tokens.len() + more.len()).div_ceil(BLOCK_SIZE) - sequence.blocks.len();
        if self.pool.free_blocks() < needed {
            let dropped = self.tree.make_room(&mut self.pool, needed);
            self.forget_snapshots(&dropped);
        }
        let Ok(fresh) = self.pool.allocate(needed) else {
            return false;
        };
        for block in &fresh {
            self.contents[block.0 as usize].clear();
            self.writers[block.0 as usize] = sequence.chunking;
        }
        sequence.blocks.extend(fresh);
        for &token in more {
            let block = sequence.blocks[sequence.tokens.len() / BLOCK_SIZE];
            let written = &mut self.contents[block.0 as usize];
            assert_eq!(
                written.len(),
                sequence.tokens.len() % BLOCK_SIZE,
                "a sequence writes only its own blocks, in order"
            );
            written.push(token);
            sequence.tokens.push(token);
        }
        true
    }

    fn insert(&mut self, sequence: &Sequence) {
        let snapshot = (self.rng.below(2) == 0).then(|| {
            self.next_snapshot += 1;
            // Mostly small enough for several to fit, sometimes too big to store at all.
            let bytes = match self.rng.below(10) {
                0 => SNAPSHOT_BUDGET + 1,
                _ => 1 + self.rng.below(SNAPSHOT_BUDGET / 4),
            };
            (SnapshotId(self.next_snapshot), bytes)
        });
        let inserted = self.tree.insert(
            &sequence.tokens,
            &sequence.keys(),
            &sequence.blocks,
            snapshot,
            &mut self.pool,
        );
        if inserted.snapshot_stored {
            let (id, _) = snapshot.expect("only an offered snapshot is stored");
            self.snapshots.insert(id, (sequence.tokens.clone(), sequence.chunking));
        }
        // The node a refused snapshot would have gone to: the sequence's, with a snapshot.
        if let Some(existing) = inserted.existing {
            assert!(snapshot.is_some() && !inserted.snapshot_stored);
            let (tokens, chunking) = &self.snapshots[&existing];
            assert_eq!(tokens, &sequence.tokens);
            let end = sequence.tokens.len();
            assert_eq!(key(*chunking, end), key(sequence.chunking, end));
        }
        self.forget_snapshots(&inserted.dropped_snapshots);
    }

    fn forget_snapshots(&mut self, dropped: &[SnapshotId]) {
        for id in dropped {
            assert!(self.snapshots.remove(id).is_some(), "{id:?} dropped twice or never stored");
        }
    }

    /// The nodes from the root to `id`.
    fn path(&self, id: NodeId) -> Vec<NodeView<'_>> {
        let nodes: BTreeMap<NodeId, NodeView> = self.tree.nodes().map(|n| (n.id, n)).collect();
        let mut path = Vec::new();
        let mut at = Some(id);
        while let Some(node) = at.map(|id| nodes[&id]) {
            path.push(node);
            at = node.parent;
        }
        path.reverse();
        path
    }

    /// The tokens from position 0 to the end of `id`.
    fn path_tokens(&self, id: NodeId) -> Vec<u32> {
        self.path(id).iter().flat_map(|n| n.tokens).copied().collect()
    }

    /// Whether `node` starts and ends a run of `tokens` that the prompt computes under the node's
    /// key.
    fn computes_alike(node: &NodeView, tokens: &[u32], chunking: u64) -> bool {
        let end = node.start + node.tokens.len();
        tokens.get(node.start..end) == Some(node.tokens) && node.key == key(chunking, end)
    }

    fn lookup_and_check(&mut self, tokens: &[u32], chunking: u64) -> Vec<ResumePoint> {
        let points = self.tree.lookup(tokens, |end| key(chunking, end));
        let mut expected_snapshots = Vec::new();
        let mut longest = 0;
        for node in self.tree.nodes() {
            let path = self.path(node.id);
            let (node, ancestors) = path.split_last().expect("a path ends at its node");
            if !ancestors.iter().all(|a| Self::computes_alike(a, tokens, chunking)) {
                continue;
            }
            let end = node.start + node.tokens.len();
            let alike = Self::computes_alike(node, tokens, chunking);
            if let Some(snapshot) = node.snapshot.filter(|_| alike) {
                expected_snapshots.push((end, snapshot));
                longest = longest.max(end);
            }
            if alike && node.tokens.len() == BLOCK_SIZE {
                longest = longest.max(end);
            }
            // The longest match: a node holding the key of the prompt's own block there.
            let rest = &tokens[node.start.min(tokens.len())..];
            let matched = node.tokens.iter().zip(rest).take_while(|(a, b)| a == b).count();
            if matched > 0 && node.key == key(chunking, node.start + rest.len().min(BLOCK_SIZE)) {
                longest = longest.max(node.start + matched);
            }
        }
        expected_snapshots.sort_by_key(|&(position, _)| std::cmp::Reverse(position));
        let snapshot_points: Vec<_> =
            points.iter().filter_map(|p| Some((p.position, p.snapshot?))).collect();
        assert_eq!(
            snapshot_points, expected_snapshots,
            "lookup {tokens:?} under chunking {chunking}"
        );
        if self.tree.kind() == CacheKind::AttentionOnly {
            assert_eq!(
                points.first().map_or(0, |p| p.position),
                longest,
                "lookup {tokens:?} under chunking {chunking}"
            );
        } else {
            assert_eq!(points.len(), snapshot_points.len(), "hybrid lookups return snapshots only");
        }
        for pair in points.windows(2) {
            assert!(pair[0].position > pair[1].position, "deepest first");
        }
        for point in &points {
            let full = point.position / BLOCK_SIZE * BLOCK_SIZE;
            assert!(point.position >= 1 && point.position <= tokens.len());
            assert_eq!(point.blocks.len(), point.position / BLOCK_SIZE);
            for (i, block) in point.blocks.iter().enumerate() {
                let run = &tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                assert_eq!(self.contents[block.0 as usize], run, "full block {i} of {point:?}");
                let end = (i + 1) * BLOCK_SIZE;
                let writer = self.writers[block.0 as usize];
                assert_eq!(
                    key(writer, end),
                    key(chunking, end),
                    "full block {i} of {point:?} was cut otherwise"
                );
            }
            assert_eq!(point.partial.is_some(), point.position > full);
            if let Some(partial) = point.partial {
                let written = &self.contents[partial.0 as usize];
                assert_eq!(
                    written[..point.position - full],
                    tokens[full..point.position],
                    "{point:?}"
                );
                // A snapshot's node ends at it; a longest match's node ends where the prompt's block does.
                let end = if point.snapshot.is_some() {
                    point.position
                } else {
                    (full + BLOCK_SIZE).min(tokens.len())
                };
                let writer = self.writers[partial.0 as usize];
                assert_eq!(
                    key(writer, end),
                    key(chunking, end),
                    "the partial block of {point:?} was cut otherwise"
                );
            }
            if let Some(snapshot) = point.snapshot {
                let (taken_after, taker) = &self.snapshots[&snapshot];
                assert_eq!(taken_after, &tokens[..point.position], "{point:?}");
                assert_eq!(key(*taker, point.position), key(chunking, point.position), "{point:?}");
            }
        }
        points
    }

    fn check(&self) {
        self.tree.check_invariants(&self.pool);
        let mut expected = vec![0u32; POOL_BLOCKS];
        for node in self.tree.nodes() {
            expected[node.block.0 as usize] += 1;
            let written = &self.contents[node.block.0 as usize];
            assert_eq!(
                &written[..node.tokens.len()],
                node.tokens,
                "node {:?} names another KV",
                node.id
            );
            let end = node.start + node.tokens.len();
            let writer = self.writers[node.block.0 as usize];
            assert_eq!(
                node.key,
                key(writer, end),
                "node {:?} names a KV computed otherwise",
                node.id
            );
            if let Some(snapshot) = node.snapshot {
                let (tokens, taker) = &self.snapshots[&snapshot];
                assert_eq!(tokens, &self.path_tokens(node.id));
                assert_eq!(key(*taker, end), node.key);
            }
        }
        for block in self.live.iter().flat_map(|s| &s.blocks) {
            expected[block.0 as usize] += 1;
        }
        let held: Vec<u32> =
            (0..POOL_BLOCKS as u32).map(|b| self.pool.holders(BlockId(b))).collect();
        assert_eq!(held, expected, "holders == tree references + sequence references");
        assert_eq!(self.pool.free_blocks(), held.iter().filter(|&&h| h == 0).count());
        assert_eq!(self.tree.snapshots(), self.snapshots.keys().copied().collect::<Vec<_>>());
        assert!(self.tree.snapshot_bytes() <= SNAPSHOT_BUDGET);
    }
}

fn run(kind: CacheKind, seed: u64) {
    let mut world = World::new(kind, seed);
    for _ in 0..3000 {
        world.step();
    }
    for done in std::mem::take(&mut world.live) {
        world.pool.release(&done.blocks);
    }
    let dropped = world.tree.make_room(&mut world.pool, POOL_BLOCKS);
    world.forget_snapshots(&dropped);
    world.check();
    assert_eq!(
        (world.pool.free_blocks(), world.tree.node_count()),
        (POOL_BLOCKS, 0),
        "everything can go"
    );
}

#[test]
fn random_attention_only_traffic_keeps_the_books() {
    for seed in [0x9E37_79B9_7F4A_7C15, 42, 7] {
        run(CacheKind::AttentionOnly, seed);
    }
}

#[test]
fn random_hybrid_traffic_keeps_the_books() {
    for seed in [0x9E37_79B9_7F4A_7C15, 42, 7] {
        run(CacheKind::Hybrid, seed);
    }
}
