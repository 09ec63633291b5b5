//! Exact scenarios: block ids, reference counts, resume points and eviction order.

use super::*;

const A: u32 = 1;
const B: u32 = 2;
const C: u32 = 3;
const D: u32 = 4;
const E: u32 = 5;
const F: u32 = 6;
const G: u32 = 7;
const H: u32 = 8;

/// The chunking key of the block ending at `end` under one of a few ways to cut prompts.
fn key(chunking: u64, end: usize) -> u64 {
    chunking << 32 | end as u64
}

/// How the prompts of most tests are cut: all alike.
fn same(end: usize) -> u64 {
    key(0, end)
}

/// Another way to cut them, that computes every block differently.
fn other(end: usize) -> u64 {
    key(1, end)
}

/// Cuts the first block (positions `0..4`) as [`same`] does and the rest as [`other`].
fn mixed(end: usize) -> u64 {
    if end <= 4 {
        same(end)
    } else {
        other(end)
    }
}

/// The keys of the blocks of `0..len` under `key_at`, the last ending at `len`.
fn keys(len: usize, key_at: fn(usize) -> u64) -> Vec<u64> {
    (1..=len.div_ceil(4)).map(|i| key_at((i * 4).min(len))).collect()
}

/// Inserts under the [`same`] chunking.
fn insert(
    tree: &mut PrefixTree,
    tokens: &[u32],
    blocks: &[BlockId],
    snapshot: Option<(SnapshotId, usize)>,
    pool: &mut BlockPool,
) -> Inserted {
    tree.insert(tokens, &keys(tokens.len(), same), blocks, snapshot, pool)
}

fn ids(v: &[u32]) -> Vec<BlockId> {
    v.iter().map(|&i| BlockId(i)).collect()
}

fn holders(pool: &BlockPool, blocks: &[u32]) -> Vec<u32> {
    blocks.iter().map(|&b| pool.holders(BlockId(b))).collect()
}

/// (id, parent, tokens, block, snapshot) of every node, lowest id first.
type Shape = Vec<(u32, Option<u32>, Vec<u32>, u32, Option<u64>)>;

fn shape(tree: &PrefixTree) -> Shape {
    tree.nodes()
        .map(|n| {
            (n.id.0, n.parent.map(|p| p.0), n.tokens.to_vec(), n.block.0, n.snapshot.map(|s| s.0))
        })
        .collect()
}

/// The key of every node, lowest id first.
fn node_keys(tree: &PrefixTree) -> Vec<u64> {
    tree.nodes().map(|n| n.key).collect()
}

fn point(
    position: usize,
    blocks: &[u32],
    partial: Option<u32>,
    snapshot: Option<u64>,
) -> ResumePoint {
    ResumePoint {
        position,
        blocks: ids(blocks),
        partial: partial.map(BlockId),
        snapshot: snapshot.map(SnapshotId),
    }
}

fn stored() -> Inserted {
    Inserted { snapshot_stored: true, existing: None, dropped_snapshots: Vec::new() }
}

fn not_stored() -> Inserted {
    Inserted { snapshot_stored: false, existing: None, dropped_snapshots: Vec::new() }
}

/// The tree of the module doc, each sequence releasing its blocks once inserted:
/// node 0 `a b c d` (block 0) → node 1 `e f g h` (block 1, snapshot 8 in hybrid mode),
/// node 2 `a b` (block 2, snapshot 2), node 0 → node 3 `e f` (block 3, snapshot 6),
/// node 0 → node 4 `e` (block 4, no snapshot: pruned in hybrid mode).
fn doc_tree(kind: CacheKind) -> (PrefixTree, BlockPool) {
    let mut pool = BlockPool::new(8, 4);
    let mut tree = PrefixTree::new(4, kind, 1000);
    let full_snapshot = (kind == CacheKind::Hybrid).then_some((SnapshotId(8), 10));
    pool.allocate(5).unwrap();
    insert(&mut tree, &[A, B, C, D, E, F, G, H], &ids(&[0, 1]), full_snapshot, &mut pool);
    insert(&mut tree, &[A, B], &ids(&[2]), Some((SnapshotId(2), 10)), &mut pool);
    insert(&mut tree, &[A, B, C, D, E, F], &ids(&[0, 3]), Some((SnapshotId(6), 10)), &mut pool);
    insert(&mut tree, &[A, B, C, D, E], &ids(&[0, 4]), None, &mut pool);
    pool.release(&ids(&[0, 1, 2, 3, 4]));
    tree.check_invariants(&pool);
    (tree, pool)
}

#[test]
fn insert_adopts_only_blocks_the_tree_lacks() {
    let mut pool = BlockPool::new(12, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let first = pool.allocate(3).unwrap();
    let inserted = insert(&mut tree, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &first, None, &mut pool);
    assert_eq!(inserted, not_stored());
    assert_eq!(holders(&pool, &[0, 1, 2]), [2, 2, 2], "the sequence and the tree");
    assert_eq!(
        shape(&tree),
        vec![
            (0, None, vec![1, 2, 3, 4], 0, None),
            (1, Some(0), vec![5, 6, 7, 8], 1, None),
            (2, Some(1), vec![9, 10], 2, None),
        ]
    );

    // Computed without the cache: the tree keeps its own copies of the two shared blocks.
    let second = pool.allocate(3).unwrap();
    assert_eq!(second, ids(&[3, 4, 5]));
    insert(&mut tree, &[1, 2, 3, 4, 5, 6, 7, 8, 11], &second, None, &mut pool);
    assert_eq!(holders(&pool, &[3, 4, 5]), [1, 1, 2]);
    assert_eq!(shape(&tree)[3], (3, Some(1), vec![11], 5, None));

    // The same tokens again add nothing but the snapshot.
    let third = pool.allocate(3).unwrap();
    let inserted = insert(
        &mut tree,
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        &third,
        Some((SnapshotId(7), 5)),
        &mut pool,
    );
    assert_eq!(inserted, stored());
    assert_eq!(holders(&pool, &[0, 1, 2, 6, 7, 8]), [2, 2, 2, 1, 1, 1]);
    assert_eq!(tree.node_count(), 4);
    assert_eq!(tree.snapshots(), [SnapshotId(7)]);
    assert_eq!(tree.snapshot_bytes(), 5);

    // An empty sequence has no node to hold a snapshot.
    assert_eq!(insert(&mut tree, &[], &[], Some((SnapshotId(9), 1)), &mut pool), not_stored());
    tree.check_invariants(&pool);
}

#[test]
fn a_node_keeps_its_first_snapshot() {
    let (mut tree, mut pool) = doc_tree(CacheKind::AttentionOnly);
    let blocks = pool.allocate(1).unwrap();
    let inserted = insert(&mut tree, &[A, B], &blocks, Some((SnapshotId(99), 10)), &mut pool);
    let expected = Inserted { existing: Some(SnapshotId(2)), ..not_stored() };
    assert_eq!(
        inserted, expected,
        "the caller drops snapshot 99's payload (or upgrades snapshot 2 with it)"
    );
    assert_eq!(tree.snapshots(), [SnapshotId(2), SnapshotId(6)]);
    assert_eq!(pool.holders(blocks[0]), 1, "the existing node kept its own block");
}

#[test]
fn attention_lookup_returns_the_longest_match_and_every_snapshot_on_the_way() {
    let (mut tree, mut pool) = doc_tree(CacheKind::AttentionOnly);
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F, G, H, 9], same),
        [
            point(8, &[0, 1], None, None),
            point(6, &[0], Some(3), Some(6)),
            point(2, &[], Some(2), Some(2))
        ],
        "the partial siblings `a b` and `e f` are prefixes of the full path"
    );
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F], same),
        [point(6, &[0], Some(3), Some(6)), point(2, &[], Some(2), Some(2))],
        "the longest match coincides with snapshot 6 and is returned once, with it"
    );
    // The longest match looks only at nodes holding the key of the prompt's own block there:
    // a prompt whose block ends at 6 computes it otherwise than one whose block ends at 8 or 5.
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F, G, 9], same),
        [
            point(7, &[0], Some(1), None),
            point(6, &[0], Some(3), Some(6)),
            point(2, &[], Some(2), Some(2))
        ]
    );
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, 9], same),
        [point(5, &[0], Some(3), None), point(2, &[], Some(2), Some(2))]
    );
    assert_eq!(
        tree.lookup(&[A, B, C], same),
        [point(2, &[], Some(2), Some(2))],
        "not `a b c d`: cut past 3"
    );
    assert_eq!(tree.lookup(&[A, B, 9], same), [point(2, &[], Some(2), Some(2))]);
    assert_eq!(
        tree.lookup(&[A, 9], same),
        [point(1, &[], Some(2), None)],
        "`a b` ends at 2 like the prompt"
    );
    assert_eq!(tree.lookup(&[G], same), []);
    assert_eq!(tree.lookup(&[], same), [], "never position 0");

    // `e f` and `e g` hold the same key and both match one token: the lowest node id wins.
    let blocks = [ids(&[0]), pool.allocate(1).unwrap()].concat();
    insert(&mut tree, &[A, B, C, D, E, G], &blocks, None, &mut pool);
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, 9], same),
        [point(5, &[0], Some(3), None), point(2, &[], Some(2), Some(2))]
    );
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, G], same),
        [point(6, &[0], Some(5), None), point(2, &[], Some(2), Some(2))]
    );
    tree.check_invariants(&pool);
}

#[test]
fn hybrid_lookup_returns_only_snapshot_points() {
    let (mut tree, pool) = doc_tree(CacheKind::Hybrid);
    assert_eq!(pool.holders(BlockId(4)), 0, "the snapshot-less `e` leaf was pruned at once");
    assert_eq!(tree.node_count(), 4);
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F, G, H, 9], same),
        [
            point(8, &[0, 1], None, Some(8)),
            point(6, &[0], Some(3), Some(6)),
            point(2, &[], Some(2), Some(2))
        ]
    );
    assert_eq!(tree.lookup(&[A, B, C, D, E, 9], same), [point(2, &[], Some(2), Some(2))]);
    assert_eq!(
        tree.lookup(&[A, B, C, D], same),
        [point(2, &[], Some(2), Some(2))],
        "no snapshot at 4"
    );
    assert_eq!(tree.lookup(&[A], same), []);
}

#[test]
fn a_block_named_by_a_partial_and_a_full_node_is_freed_when_both_go() {
    let mut pool = BlockPool::new(1, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let block = pool.allocate(1).unwrap();
    insert(&mut tree, &[A, B], &block, None, &mut pool);
    // The sequence writes on into its block, which the tree adopts again as a full node.
    insert(&mut tree, &[A, B, C, D], &block, None, &mut pool);
    assert_eq!(pool.holders(block[0]), 3);
    assert_eq!(
        shape(&tree),
        vec![(0, None, vec![A, B], 0, None), (1, None, vec![A, B, C, D], 0, None)]
    );
    pool.release(&block);
    assert_eq!(
        tree.lookup(&[A, B, C, D, E], same),
        [point(4, &[0], None, None)],
        "touches node 1 only"
    );
    assert_eq!(tree.make_room(&mut pool, 1), []);
    assert_eq!(pool.free_blocks(), 1);
    assert_eq!(tree.node_count(), 0);
}

#[test]
fn make_room_drops_lru_leaves_the_tree_alone_holds() {
    let mut pool = BlockPool::new(6, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let a = pool.allocate(2).unwrap();
    insert(&mut tree, &[1, 2, 3, 4, 5], &a, Some((SnapshotId(5), 1)), &mut pool); // tick 1
    pool.release(&a);
    let resume = tree.lookup(&[1, 2, 3, 4, 6], same); // tick 2
    assert_eq!(resume, [point(4, &[0], None, None)]);
    pool.share(&resume[0].blocks);
    let b = [resume[0].blocks.clone(), pool.allocate(1).unwrap()].concat();
    insert(&mut tree, &[1, 2, 3, 4, 6], &b, None, &mut pool); // tick 3
    pool.release(&b);
    let running = pool.allocate(1).unwrap(); // its sequence keeps running
    insert(&mut tree, &[7], &running, None, &mut pool); // tick 4
    assert_eq!(
        shape(&tree),
        vec![
            (0, None, vec![1, 2, 3, 4], 0, None),
            (1, Some(0), vec![5], 1, Some(5)),
            (2, Some(0), vec![6], 2, None),
            (3, None, vec![7], 3, None),
        ]
    );
    tree.lookup(&[1, 2, 3, 4, 5], same); // tick 5: node 1 is now newer than node 2

    assert_eq!(tree.make_room(&mut pool, 3), []);
    assert_eq!(holders(&pool, &[0, 1, 2, 3]), [1, 1, 0, 2], "node 2 went");
    assert_eq!(tree.make_room(&mut pool, 6), [SnapshotId(5)]);
    assert_eq!(holders(&pool, &[0, 1, 2, 3]), [0, 0, 0, 2], "node 1, then its parent, went");
    assert_eq!(pool.free_blocks(), 5, "node 3's block is held by its sequence");
    assert_eq!(shape(&tree), vec![(3, None, vec![7], 3, None)]);

    pool.release(&running);
    assert_eq!(tree.make_room(&mut pool, 6), []);
    assert_eq!((pool.free_blocks(), tree.node_count()), (6, 0));
}

#[test]
fn make_room_stops_when_enough_is_free() {
    let mut pool = BlockPool::new(3, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    for token in [1, 2, 3] {
        let block = pool.allocate(1).unwrap();
        insert(&mut tree, &[token], &block, None, &mut pool);
        pool.release(&block);
    }
    assert_eq!(tree.make_room(&mut pool, 0), []);
    assert_eq!(tree.node_count(), 3);
    tree.make_room(&mut pool, 2);
    assert_eq!(shape(&tree), vec![(2, None, vec![3], 2, None)], "the two oldest went");
    let block = pool.allocate(1).unwrap();
    insert(&mut tree, &[4], &block, None, &mut pool);
    assert_eq!(shape(&tree)[0], (0, None, vec![4], 0, None), "the lowest free slot is reused");
}

#[test]
fn hybrid_eviction_prunes_snapshot_less_ancestors() {
    let mut pool = BlockPool::new(4, 4);
    let mut tree = PrefixTree::new(4, CacheKind::Hybrid, 1000);
    let a = pool.allocate(2).unwrap();
    insert(&mut tree, &[1, 2, 3, 4, 5, 6, 7, 8], &a, Some((SnapshotId(1), 1)), &mut pool);
    let b = [a[..1].to_vec(), pool.allocate(1).unwrap()].concat();
    insert(&mut tree, &[1, 2, 3, 4, 9], &b, Some((SnapshotId(2), 1)), &mut pool);
    pool.release(&a);
    pool.release(&b[1..]);
    assert_eq!(tree.make_room(&mut pool, 2), [SnapshotId(1)]);
    assert_eq!(tree.node_count(), 2, "node 0 still leads to node 2");
    assert_eq!(tree.make_room(&mut pool, 4), [SnapshotId(2)]);
    assert_eq!((pool.free_blocks(), tree.node_count()), (4, 0), "node 0 lost its last child");

    let c = pool.allocate(2).unwrap();
    assert_eq!(insert(&mut tree, &[1, 2, 3, 4, 5], &c, None, &mut pool), not_stored());
    assert_eq!(tree.node_count(), 0, "nothing to resume from, so nothing is kept");
    assert_eq!(holders(&pool, &[0, 1]), [1, 1]);
}

#[test]
fn the_snapshot_budget_drops_least_recently_used_snapshots() {
    let mut pool = BlockPool::new(8, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 100);
    let blocks = pool.allocate(5).unwrap();
    let mut offer = |tree: &mut PrefixTree, token: u32, id: u64, bytes: usize| {
        let block = &blocks[token as usize - 1..token as usize];
        insert(tree, &[token], block, Some((SnapshotId(id), bytes)), &mut pool)
    };
    offer(&mut tree, 1, 1, 40);
    offer(&mut tree, 2, 2, 40);
    tree.lookup(&[1], same);
    let third = offer(&mut tree, 3, 3, 40);
    assert_eq!(third, Inserted { dropped_snapshots: vec![SnapshotId(2)], ..stored() });
    assert_eq!((tree.snapshots(), tree.snapshot_bytes()), (vec![SnapshotId(1), SnapshotId(3)], 80));

    assert_eq!(offer(&mut tree, 4, 4, 101), not_stored(), "alone over the budget");
    assert_eq!(tree.snapshot_bytes(), 80);
    let fifth = offer(&mut tree, 5, 5, 100);
    assert_eq!(
        fifth,
        Inserted { dropped_snapshots: vec![SnapshotId(1), SnapshotId(3)], ..stored() }
    );
    assert_eq!(tree.node_count(), 5, "attention-only nodes stay useful without snapshots");
}

/// A conversation's snapshots are all touched by its latest call; when another conversation
/// needs room, the conversation keeps its deepest (most recent) snapshots and gives up the
/// shallow ones first, whatever slots its nodes took.
#[test]
fn the_snapshot_budget_keeps_the_deepest_snapshots_of_a_conversation() {
    let mut pool = BlockPool::new(16, 4);
    let mut tree = PrefixTree::new(4, CacheKind::Hybrid, 100);
    let talk: Vec<u32> = (1..=16).collect();
    let path = pool.allocate(4).unwrap();
    let mut single = || pool.allocate(1).unwrap();
    let (other, later, last) = (single(), single(), single());
    insert(&mut tree, &[90], &other, Some((SnapshotId(1), 10)), &mut pool);
    for (len, id, bytes) in [(4, 2, 30), (8, 3, 50), (12, 4, 10)] {
        let blocks = &path[..len / 4];
        insert(&mut tree, &talk[..len], blocks, Some((SnapshotId(id), bytes)), &mut pool);
    }
    // Another conversation's first call drops the oldest snapshot (and frees node 0's slot)...
    let fifth = insert(&mut tree, &[70], &later, Some((SnapshotId(5), 10)), &mut pool);
    assert_eq!(fifth.dropped_snapshots, [SnapshotId(1)]);
    // ... which the conversation's next call takes for its deepest node.
    let sixth = insert(&mut tree, &talk, &path, Some((SnapshotId(6), 10)), &mut pool);
    assert_eq!(sixth.dropped_snapshots, [SnapshotId(5)]);
    // A third conversation needs 40 bytes: the shallowest snapshots of the first go.
    let seventh = insert(&mut tree, &[80], &last, Some((SnapshotId(7), 40)), &mut pool);
    assert_eq!(seventh.dropped_snapshots, [SnapshotId(2), SnapshotId(3)]);
    assert_eq!(tree.snapshots(), [SnapshotId(4), SnapshotId(6), SnapshotId(7)]);
    tree.check_invariants(&pool);
}

#[test]
fn hybrid_budget_eviction_prunes_the_nodes_it_empties() {
    let mut pool = BlockPool::new(4, 4);
    let mut tree = PrefixTree::new(4, CacheKind::Hybrid, 100);
    let a = pool.allocate(2).unwrap();
    insert(&mut tree, &[1, 2, 3, 4, 5], &a, Some((SnapshotId(1), 60)), &mut pool);
    let b = [a[..1].to_vec(), pool.allocate(1).unwrap()].concat();
    let second = insert(&mut tree, &[1, 2, 3, 4, 6], &b, Some((SnapshotId(2), 60)), &mut pool);
    assert_eq!(second.dropped_snapshots, [SnapshotId(1)]);
    assert_eq!(holders(&pool, &[0, 1, 2]), [2, 1, 2], "node 1 went with its snapshot");
    let c = pool.allocate(1).unwrap();
    let third = insert(&mut tree, &[9], &c, Some((SnapshotId(3), 100)), &mut pool);
    assert_eq!(third.dropped_snapshots, [SnapshotId(2)]);
    assert_eq!(shape(&tree), vec![(1, None, vec![9], 3, Some(3))], "node 2 went, then node 0");
    assert_eq!(holders(&pool, &[0, 1, 2, 3]), [1, 1, 1, 2]);
    tree.check_invariants(&pool);
}

#[test]
fn equal_tokens_under_another_key_are_another_node() {
    let mut pool = BlockPool::new(8, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10];
    let first = pool.allocate(3).unwrap();
    tree.insert(&tokens, &keys(10, same), &first, Some((SnapshotId(1), 1)), &mut pool);
    // Cut alike in the first block only: the rest is computed again and kept beside the first.
    let second = pool.allocate(3).unwrap();
    let inserted =
        tree.insert(&tokens, &keys(10, mixed), &second, Some((SnapshotId(2), 1)), &mut pool);
    assert_eq!(inserted, stored(), "another node: its own snapshot");
    assert_eq!(
        shape(&tree),
        vec![
            (0, None, vec![1, 2, 3, 4], 0, None),
            (1, Some(0), vec![5, 6, 7, 8], 1, None),
            (2, Some(1), vec![9, 10], 2, Some(1)),
            (3, Some(0), vec![5, 6, 7, 8], 4, None),
            (4, Some(3), vec![9, 10], 5, Some(2)),
        ]
    );
    assert_eq!(node_keys(&tree), [same(4), same(8), same(10), other(8), other(10)]);
    assert_eq!(
        holders(&pool, &[0, 1, 2, 3, 4, 5]),
        [2, 2, 2, 1, 2, 2],
        "block 3 is block 0 cut alike"
    );
    tree.check_invariants(&pool);

    // Each chunking finds its own blocks and snapshot, and nothing of a third.
    assert_eq!(tree.lookup(&tokens, same), [point(10, &[0, 1], Some(2), Some(1))]);
    assert_eq!(tree.lookup(&tokens, mixed), [point(10, &[0, 4], Some(5), Some(2))]);
    assert_eq!(tree.lookup(&tokens, other), [], "not even the first block: cut otherwise");
    let cut_after_8 = |end| if end <= 8 { mixed(end) } else { key(2, end) };
    assert_eq!(
        tree.lookup(&tokens, cut_after_8),
        [point(8, &[0, 4], None, None)],
        "blocks 0 and 4, not `9 10`"
    );

    // Inserting under an existing key follows that node again.
    let blocks = [vec![BlockId(0)], pool.allocate(1).unwrap()].concat();
    pool.share(&blocks[..1]);
    let inserted =
        tree.insert(&tokens[..8], &keys(8, mixed), &blocks, Some((SnapshotId(3), 1)), &mut pool);
    assert_eq!(inserted, stored(), "the node `5 6 7 8` under `mixed` had no snapshot");
    assert_eq!(tree.node_count(), 5);
    assert_eq!(tree.lookup(&tokens[..8], mixed), [point(8, &[0, 4], None, Some(3))]);
    tree.check_invariants(&pool);
}

#[test]
fn a_prompt_cut_otherwise_does_not_resume_from_snapshots_or_blocks() {
    let (mut tree, _pool) = doc_tree(CacheKind::AttentionOnly);
    let prompt = [A, B, C, D, E, F, G, H, 9];
    assert_eq!(tree.lookup(&prompt, other), []);
    assert_eq!(tree.lookup(&[A, B], other), []);
    // Cut alike up to 4: the snapshot at 2 and the first block, but not `e f` (snapshot 6) nor
    // `e f g h`.
    assert_eq!(
        tree.lookup(&prompt, mixed),
        [point(4, &[0], None, None), point(2, &[], Some(2), Some(2))]
    );
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, 9], mixed),
        [point(4, &[0], None, None), point(2, &[], Some(2), Some(2))]
    );
    // The longest match only looks at nodes under the prompt's own key for that block: `a b c`
    // of a prompt ending at 3 is cut otherwise than the block `a b c d` was.
    assert_eq!(tree.lookup(&[A, B, C], same), [point(2, &[], Some(2), Some(2))]);
    assert_eq!(
        tree.lookup(&[A, B, C], |end| if end == 3 { same(4) } else { same(end) }),
        [point(3, &[], Some(0), None), point(2, &[], Some(2), Some(2))]
    );

    let (mut tree, _pool) = doc_tree(CacheKind::Hybrid);
    assert_eq!(
        tree.lookup(&prompt, same),
        [
            point(8, &[0, 1], None, Some(8)),
            point(6, &[0], Some(3), Some(6)),
            point(2, &[], Some(2), Some(2))
        ]
    );
    assert_eq!(tree.lookup(&prompt, mixed), [point(2, &[], Some(2), Some(2))]);
    assert_eq!(tree.lookup(&prompt, other), []);
}

#[test]
fn a_snapshot_grows_within_the_budget() {
    let mut pool = BlockPool::new(4, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 100);
    let blocks = pool.allocate(3).unwrap();
    for (token, block) in [1, 2, 3].into_iter().zip(&blocks) {
        insert(&mut tree, &[token], &[*block], Some((SnapshotId(token.into()), 30)), &mut pool);
    }
    tree.lookup(&[1], same);
    assert_eq!(tree.resize_snapshot(SnapshotId(3), 101, &mut pool), None, "alone over the budget");
    assert_eq!(tree.resize_snapshot(SnapshotId(9), 1, &mut pool), None, "not held");
    assert_eq!(tree.snapshot_bytes(), 90);
    assert_eq!(
        tree.resize_snapshot(SnapshotId(3), 50, &mut pool),
        Some(vec![SnapshotId(2)]),
        "the least recent other"
    );
    assert_eq!((tree.snapshots(), tree.snapshot_bytes()), (vec![SnapshotId(1), SnapshotId(3)], 80));
    assert_eq!(tree.resize_snapshot(SnapshotId(1), 10, &mut pool), Some(vec![]));
    assert_eq!(tree.snapshot_bytes(), 60);
    tree.check_invariants(&pool);
}
