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
        .map(|n| (n.id.0, n.parent.map(|p| p.0), n.tokens.to_vec(), n.block.0, n.snapshot.map(|s| s.0)))
        .collect()
}

fn point(position: usize, blocks: &[u32], partial: Option<u32>, snapshot: Option<u64>) -> ResumePoint {
    ResumePoint { position, blocks: ids(blocks), partial: partial.map(BlockId), snapshot: snapshot.map(SnapshotId) }
}

fn stored() -> Inserted {
    Inserted { snapshot_stored: true, dropped_snapshots: Vec::new() }
}

fn not_stored() -> Inserted {
    Inserted { snapshot_stored: false, dropped_snapshots: Vec::new() }
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
    tree.insert(&[A, B, C, D, E, F, G, H], &ids(&[0, 1]), full_snapshot, &mut pool);
    tree.insert(&[A, B], &ids(&[2]), Some((SnapshotId(2), 10)), &mut pool);
    tree.insert(&[A, B, C, D, E, F], &ids(&[0, 3]), Some((SnapshotId(6), 10)), &mut pool);
    tree.insert(&[A, B, C, D, E], &ids(&[0, 4]), None, &mut pool);
    pool.release(&ids(&[0, 1, 2, 3, 4]));
    tree.check_invariants(&pool);
    (tree, pool)
}

#[test]
fn insert_adopts_only_blocks_the_tree_lacks() {
    let mut pool = BlockPool::new(12, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let first = pool.allocate(3).unwrap();
    let inserted = tree.insert(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &first, None, &mut pool);
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
    tree.insert(&[1, 2, 3, 4, 5, 6, 7, 8, 11], &second, None, &mut pool);
    assert_eq!(holders(&pool, &[3, 4, 5]), [1, 1, 2]);
    assert_eq!(shape(&tree)[3], (3, Some(1), vec![11], 5, None));

    // The same tokens again add nothing but the snapshot.
    let third = pool.allocate(3).unwrap();
    let inserted = tree.insert(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], &third, Some((SnapshotId(7), 5)), &mut pool);
    assert_eq!(inserted, stored());
    assert_eq!(holders(&pool, &[0, 1, 2, 6, 7, 8]), [2, 2, 2, 1, 1, 1]);
    assert_eq!(tree.node_count(), 4);
    assert_eq!(tree.snapshots(), [SnapshotId(7)]);
    assert_eq!(tree.snapshot_bytes(), 5);

    // An empty sequence has no node to hold a snapshot.
    assert_eq!(tree.insert(&[], &[], Some((SnapshotId(9), 1)), &mut pool), not_stored());
    tree.check_invariants(&pool);
}

#[test]
fn a_node_keeps_its_first_snapshot() {
    let (mut tree, mut pool) = doc_tree(CacheKind::AttentionOnly);
    let blocks = pool.allocate(1).unwrap();
    let inserted = tree.insert(&[A, B], &blocks, Some((SnapshotId(99), 10)), &mut pool);
    assert_eq!(inserted, not_stored(), "the caller drops snapshot 99's payload");
    assert_eq!(tree.snapshots(), [SnapshotId(2), SnapshotId(6)]);
    assert_eq!(pool.holders(blocks[0]), 1, "the existing node kept its own block");
}

#[test]
fn attention_lookup_returns_the_longest_match_and_every_snapshot_on_the_way() {
    let (mut tree, _pool) = doc_tree(CacheKind::AttentionOnly);
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F, G, H, 9]),
        [point(8, &[0, 1], None, None), point(6, &[0], Some(3), Some(6)), point(2, &[], Some(2), Some(2))],
        "the partial siblings `a b` and `e f` are prefixes of the full path"
    );
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, 9]),
        [point(5, &[0], Some(1), None), point(2, &[], Some(2), Some(2))],
        "`e f g h`, `e f` and `e` all match one token: the lowest node id wins"
    );
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F]),
        [point(6, &[0], Some(3), Some(6)), point(2, &[], Some(2), Some(2))],
        "the longest match coincides with snapshot 6 and is returned once, with it"
    );
    assert_eq!(tree.lookup(&[A, B, C]), [point(3, &[], Some(0), None), point(2, &[], Some(2), Some(2))]);
    assert_eq!(tree.lookup(&[A, B, 9]), [point(2, &[], Some(2), Some(2))]);
    assert_eq!(tree.lookup(&[A, 9]), [point(1, &[], Some(0), None)]);
    assert_eq!(tree.lookup(&[G]), []);
    assert_eq!(tree.lookup(&[]), [], "never position 0");
}

#[test]
fn hybrid_lookup_returns_only_snapshot_points() {
    let (mut tree, pool) = doc_tree(CacheKind::Hybrid);
    assert_eq!(pool.holders(BlockId(4)), 0, "the snapshot-less `e` leaf was pruned at once");
    assert_eq!(tree.node_count(), 4);
    assert_eq!(
        tree.lookup(&[A, B, C, D, E, F, G, H, 9]),
        [point(8, &[0, 1], None, Some(8)), point(6, &[0], Some(3), Some(6)), point(2, &[], Some(2), Some(2))]
    );
    assert_eq!(tree.lookup(&[A, B, C, D, E, 9]), [point(2, &[], Some(2), Some(2))]);
    assert_eq!(tree.lookup(&[A, B, C, D]), [point(2, &[], Some(2), Some(2))], "no snapshot at 4");
    assert_eq!(tree.lookup(&[A]), []);
}

#[test]
fn a_block_named_by_a_partial_and_a_full_node_is_freed_when_both_go() {
    let mut pool = BlockPool::new(1, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let block = pool.allocate(1).unwrap();
    tree.insert(&[A, B], &block, None, &mut pool);
    // The sequence writes on into its block, which the tree adopts again as a full node.
    tree.insert(&[A, B, C, D], &block, None, &mut pool);
    assert_eq!(pool.holders(block[0]), 3);
    assert_eq!(shape(&tree), vec![(0, None, vec![A, B], 0, None), (1, None, vec![A, B, C, D], 0, None)]);
    pool.release(&block);
    assert_eq!(tree.lookup(&[A, B, C, D, E]), [point(4, &[0], None, None)], "touches node 1 only");
    assert_eq!(tree.make_room(&mut pool, 1), []);
    assert_eq!(pool.free_blocks(), 1);
    assert_eq!(tree.node_count(), 0);
}

#[test]
fn make_room_drops_lru_leaves_the_tree_alone_holds() {
    let mut pool = BlockPool::new(6, 4);
    let mut tree = PrefixTree::new(4, CacheKind::AttentionOnly, 1000);
    let a = pool.allocate(2).unwrap();
    tree.insert(&[1, 2, 3, 4, 5], &a, Some((SnapshotId(5), 1)), &mut pool); // tick 1
    pool.release(&a);
    let resume = tree.lookup(&[1, 2, 3, 4, 6]); // tick 2
    assert_eq!(resume, [point(4, &[0], None, None)]);
    pool.share(&resume[0].blocks);
    let b = [resume[0].blocks.clone(), pool.allocate(1).unwrap()].concat();
    tree.insert(&[1, 2, 3, 4, 6], &b, None, &mut pool); // tick 3
    pool.release(&b);
    let running = pool.allocate(1).unwrap(); // its sequence keeps running
    tree.insert(&[7], &running, None, &mut pool); // tick 4
    assert_eq!(
        shape(&tree),
        vec![
            (0, None, vec![1, 2, 3, 4], 0, None),
            (1, Some(0), vec![5], 1, Some(5)),
            (2, Some(0), vec![6], 2, None),
            (3, None, vec![7], 3, None),
        ]
    );
    tree.lookup(&[1, 2, 3, 4, 5]); // tick 5: node 1 is now newer than node 2

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
        tree.insert(&[token], &block, None, &mut pool);
        pool.release(&block);
    }
    assert_eq!(tree.make_room(&mut pool, 0), []);
    assert_eq!(tree.node_count(), 3);
    tree.make_room(&mut pool, 2);
    assert_eq!(shape(&tree), vec![(2, None, vec![3], 2, None)], "the two oldest went");
    let block = pool.allocate(1).unwrap();
    tree.insert(&[4], &block, None, &mut pool);
    assert_eq!(shape(&tree)[0], (0, None, vec![4], 0, None), "the lowest free slot is reused");
}

#[test]
fn hybrid_eviction_prunes_snapshot_less_ancestors() {
    let mut pool = BlockPool::new(4, 4);
    let mut tree = PrefixTree::new(4, CacheKind::Hybrid, 1000);
    let a = pool.allocate(2).unwrap();
    tree.insert(&[1, 2, 3, 4, 5, 6, 7, 8], &a, Some((SnapshotId(1), 1)), &mut pool);
    let b = [a[..1].to_vec(), pool.allocate(1).unwrap()].concat();
    tree.insert(&[1, 2, 3, 4, 9], &b, Some((SnapshotId(2), 1)), &mut pool);
    pool.release(&a);
    pool.release(&b[1..]);
    assert_eq!(tree.make_room(&mut pool, 2), [SnapshotId(1)]);
    assert_eq!(tree.node_count(), 2, "node 0 still leads to node 2");
    assert_eq!(tree.make_room(&mut pool, 4), [SnapshotId(2)]);
    assert_eq!((pool.free_blocks(), tree.node_count()), (4, 0), "node 0 lost its last child");

    let c = pool.allocate(2).unwrap();
    assert_eq!(tree.insert(&[1, 2, 3, 4, 5], &c, None, &mut pool), not_stored());
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
        tree.insert(&[token], block, Some((SnapshotId(id), bytes)), &mut pool)
    };
    offer(&mut tree, 1, 1, 40);
    offer(&mut tree, 2, 2, 40);
    tree.lookup(&[1]);
    let third = offer(&mut tree, 3, 3, 40);
    assert_eq!(third, Inserted { snapshot_stored: true, dropped_snapshots: vec![SnapshotId(2)] });
    assert_eq!((tree.snapshots(), tree.snapshot_bytes()), (vec![SnapshotId(1), SnapshotId(3)], 80));

    assert_eq!(offer(&mut tree, 4, 4, 101), not_stored(), "alone over the budget");
    assert_eq!(tree.snapshot_bytes(), 80);
    let fifth = offer(&mut tree, 5, 5, 100);
    assert_eq!(fifth, Inserted { snapshot_stored: true, dropped_snapshots: vec![SnapshotId(1), SnapshotId(3)] });
    assert_eq!(tree.node_count(), 5, "attention-only nodes stay useful without snapshots");
}

#[test]
fn hybrid_budget_eviction_prunes_the_nodes_it_empties() {
    let mut pool = BlockPool::new(4, 4);
    let mut tree = PrefixTree::new(4, CacheKind::Hybrid, 100);
    let a = pool.allocate(2).unwrap();
    tree.insert(&[1, 2, 3, 4, 5], &a, Some((SnapshotId(1), 60)), &mut pool);
    let b = [a[..1].to_vec(), pool.allocate(1).unwrap()].concat();
    let second = tree.insert(&[1, 2, 3, 4, 6], &b, Some((SnapshotId(2), 60)), &mut pool);
    assert_eq!(second.dropped_snapshots, [SnapshotId(1)]);
    assert_eq!(holders(&pool, &[0, 1, 2]), [2, 1, 2], "node 1 went with its snapshot");
    let c = pool.allocate(1).unwrap();
    let third = tree.insert(&[9], &c, Some((SnapshotId(3), 100)), &mut pool);
    assert_eq!(third.dropped_snapshots, [SnapshotId(2)]);
    assert_eq!(shape(&tree), vec![(1, None, vec![9], 3, Some(3))], "node 2 went, then node 0");
    assert_eq!(holders(&pool, &[0, 1, 2, 3]), [1, 1, 1, 2]);
    tree.check_invariants(&pool);
}
