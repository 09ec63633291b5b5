//! Random prompts go into a small prefix tree and get evicted; the events its changes make must
//! describe exactly the full blocks the tree holds at the end, with each block's own tokens and
//! parent.

use std::collections::{BTreeSet, HashMap};

use spindle_sched::{BlockPool, CacheKind, PrefixTree, SnapshotId};

use super::*;

const BS: usize = 4;

/// The hashes of the full nodes `tree` holds, from their token paths.
fn tree_hashes(tree: &PrefixTree) -> BTreeSet<BlockHash> {
    let nodes: HashMap<NodeId, (Option<NodeId>, Vec<u32>)> = tree
        .nodes()
        .filter(|n| n.tokens.len() == BS)
        .map(|n| (n.id, (n.parent, n.tokens.to_vec())))
        .collect();
    fn hash_of(id: NodeId, nodes: &HashMap<NodeId, (Option<NodeId>, Vec<u32>)>) -> BlockHash {
        let (parent, tokens) = &nodes[&id];
        block_hash(parent.map(|p| hash_of(p, nodes)), tokens)
    }
    nodes.keys().map(|&id| hash_of(id, &nodes)).collect()
}

fn run(kind: CacheKind, seed: u64) {
    let mut pool = BlockPool::new(20, BS);
    let mut tree = PrefixTree::new(BS, kind, 1000);
    tree.journal_changes();
    let mut events = BlockEvents::new(None, BS);
    let mut announced: HashMap<BlockHash, Vec<u32>> = HashMap::new();
    let mut state = seed;
    let mut next = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    for round in 0..200u64 {
        let len = 1 + next(14) as usize;
        let tokens: Vec<u32> = (0..len).map(|_| next(3) as u32).collect();
        // Two chunkings, so that a hybrid tree holds some paths twice.
        let chunking = next(2);
        let keys: Vec<u64> = (0..len.div_ceil(BS)).map(|b| chunking << 32 | b as u64).collect();
        tree.make_room(&mut pool, len.div_ceil(BS));
        let Ok(blocks) = pool.allocate(len.div_ceil(BS)) else { continue };
        tree.insert(&tokens, &keys, &blocks, Some((SnapshotId(round), 10)), &mut pool);
        pool.release(&blocks);
        for event in events.events(tree.take_changes()) {
            match event {
                KvEvent::BlockStored { hashes, parent, token_ids, block_size, .. } => {
                    assert_eq!(block_size, BS);
                    assert_eq!(token_ids.len(), hashes.len() * BS);
                    let mut before = parent;
                    for (hash, run) in hashes.iter().zip(token_ids.chunks(BS)) {
                        assert_eq!(*hash, block_hash(before, run), "a block names its parent");
                        if let Some(parent) = before {
                            assert!(announced.contains_key(&parent), "the parent came first");
                        }
                        assert!(announced.insert(*hash, run.to_vec()).is_none(), "stored twice");
                        before = Some(*hash);
                    }
                }
                KvEvent::BlockRemoved { hashes, .. } => {
                    for hash in hashes {
                        assert!(announced.remove(&hash).is_some(), "removed but never stored");
                    }
                }
                KvEvent::AllBlocksCleared => unreachable!("nothing clears the cache here"),
            }
        }
        let announced_set: BTreeSet<BlockHash> = announced.keys().copied().collect();
        assert_eq!(announced_set, tree_hashes(&tree), "round {round}");
        assert_eq!(events.held(), announced_set);
    }
}

#[test]
fn events_describe_exactly_the_full_blocks_an_attention_tree_holds() {
    for seed in 1..20 {
        run(CacheKind::AttentionOnly, seed * 7919);
    }
}

#[test]
fn events_describe_exactly_the_full_blocks_a_hybrid_tree_holds() {
    for seed in 1..20 {
        run(CacheKind::Hybrid, seed * 104_729);
    }
}

#[test]
fn a_cleared_cache_forgets_every_block() {
    let mut events = BlockEvents::new(None, BS);
    let stored = events.events(vec![BlockChange::Stored {
        node: NodeId(0),
        parent: None,
        tokens: vec![1, 2, 3, 4],
    }]);
    assert_eq!(stored.len(), 1);
    events.cleared();
    assert!(events.held().is_empty());
    // A removal the tree reports after the clear names nothing the router still holds.
    assert!(events.events(vec![BlockChange::Removed { node: NodeId(0) }]).is_empty());
}
