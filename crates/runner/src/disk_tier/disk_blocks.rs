//! The disk tier's blocks as KV-cache events (medium `STORAGE`), so a router knows what a replica
//! can load instead of prefilling, across restarts too. A snapshot file holds the KV of every
//! position of its prompt prefix, so its full blocks are "on disk" while it exists: announced
//! when the writer has written it (or, at start, when the folder already held it) and removed
//! when it is evicted or found bad. Files share prefixes (one per message boundary of a
//! conversation), so a block is announced with the first file that holds it and removed with
//! the last, under the same chained hashes as the memory tier's events.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use spindle_kv_events::{BlockHash, KvEvent, Medium};

use super::snapshot_file::{read_tokens, Layout};
use super::SNAPSHOT_EXT;
use crate::kv_events::{block_hash, hold, push_removed, push_stored, release};

pub(crate) struct DiskBlocks {
    block_size: usize,
    /// The full blocks' hashes of each file, from the first block.
    files: HashMap<PathBuf, Vec<BlockHash>>,
    /// Files holding each hash.
    holders: HashMap<BlockHash, u32>,
}

impl DiskBlocks {
    pub fn new(block_size: usize) -> Self {
        Self { block_size, files: HashMap::new(), holders: HashMap::new() }
    }

    /// The files `dir` already holds for `layout` (a restart's disk tier), as one announcement.
    pub fn scan(&mut self, dir: &Path, layout: &Layout) -> Vec<KvEvent> {
        let mut events = Vec::new();
        let Ok(entries) = fs::read_dir(dir) else { return events };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
        // In name order, so the same folder is announced alike every time.
        paths.sort();
        for path in paths.into_iter().filter(|p| p.extension().is_some_and(|e| e == SNAPSHOT_EXT)) {
            if let Some(tokens) = read_tokens(&path, layout) {
                events.extend(self.written(path, &tokens));
            }
        }
        events
    }

    /// `path` now holds the KV of `tokens`: the full blocks no other file held are stored.
    pub fn written(&mut self, path: PathBuf, tokens: &[u32]) -> Vec<KvEvent> {
        let mut events = Vec::new();
        if self.files.contains_key(&path) {
            // Rewritten with logits added: the same blocks.
            return events;
        }
        let mut parent = None;
        let mut hashes = Vec::new();
        for block in tokens.chunks_exact(self.block_size) {
            let hash = block_hash(parent, block);
            if hold(&mut self.holders, hash) {
                let stored = (hash, parent, block.to_vec());
                push_stored(&mut events, stored, self.block_size, Medium::Disk);
            }
            hashes.push(hash);
            parent = Some(hash);
        }
        self.files.insert(path, hashes);
        events
    }

    /// `path` is gone (evicted, or deleted as bad): the blocks no other file holds are removed.
    pub fn removed(&mut self, path: &Path) -> Vec<KvEvent> {
        let mut events = Vec::new();
        for hash in self.files.remove(path).unwrap_or_default() {
            if release(&mut self.holders, hash) {
                push_removed(&mut events, hash, Medium::Disk);
            }
        }
        events
    }

    /// The hashes on disk now, as the events so far describe them.
    #[cfg(test)]
    pub fn held(&self) -> std::collections::BTreeSet<BlockHash> {
        self.holders.keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::snapshot_file::encode;
    use super::super::snapshot_file::tests::{layout, snapshot};
    use super::*;

    const BS: usize = 4;

    /// Replays events into the set of hashes they say are on disk, checking each is consistent.
    fn apply(on_disk: &mut std::collections::BTreeSet<BlockHash>, events: &[KvEvent]) {
        for event in events {
            match event {
                KvEvent::BlockStored { hashes, parent, token_ids, block_size, medium } => {
                    assert_eq!((*medium, *block_size), (Medium::Disk, BS));
                    assert_eq!(token_ids.len(), hashes.len() * BS);
                    assert!(parent.is_none_or(|p| on_disk.contains(&p)), "parent not on disk");
                    for hash in hashes {
                        assert!(on_disk.insert(*hash), "stored twice");
                    }
                }
                KvEvent::BlockRemoved { hashes, medium } => {
                    assert_eq!(*medium, Medium::Disk);
                    for hash in hashes {
                        assert!(on_disk.remove(hash), "removed but not stored");
                    }
                }
                KvEvent::AllBlocksCleared => panic!("the disk tier never clears"),
            }
        }
    }

    #[test]
    fn files_sharing_a_prefix_announce_it_once_and_remove_it_with_the_last() {
        let mut blocks = DiskBlocks::new(BS);
        let mut on_disk = Default::default();
        let short: Vec<u32> = (0..9).collect(); // 2 full blocks and a partial one
        let long: Vec<u32> = (0..17).collect(); // the same 2, then 2 more
        let events = blocks.written("a.snap".into(), &short);
        assert!(
            matches!(&events[..], [KvEvent::BlockStored { hashes, parent: None, token_ids, .. }]
            if hashes.len() == 2 && token_ids == &short[..8])
        );
        apply(&mut on_disk, &events);
        let events = blocks.written("b.snap".into(), &long);
        // Only the 2 new blocks, chained to the shared prefix's last.
        assert!(
            matches!(&events[..], [KvEvent::BlockStored { hashes, parent: Some(_), token_ids, .. }]
            if hashes.len() == 2 && token_ids == &long[8..16])
        );
        apply(&mut on_disk, &events);
        assert!(blocks.written("b.snap".into(), &long).is_empty(), "a rewrite stores nothing");
        apply(&mut on_disk, &blocks.removed(Path::new("a.snap")));
        assert_eq!(on_disk.len(), 4, "the shared blocks stay while b holds them");
        apply(&mut on_disk, &blocks.removed(Path::new("b.snap")));
        assert!(on_disk.is_empty());
        assert!(blocks.removed(Path::new("b.snap")).is_empty(), "gone twice is gone once");
        assert_eq!(blocks.held(), on_disk);
    }

    #[test]
    fn a_restart_announces_the_files_its_folder_holds_for_its_own_layout() {
        let dir = tempfile::tempdir().unwrap();
        let mine = layout("m");
        let tokens: Vec<u32> = (1..=9).collect();
        fs::write(dir.path().join("a.snap"), encode(&mine, &snapshot(&tokens, 1, 0.5, true)))
            .unwrap();
        // Another build's file would be refused at load, so it is not announced; nor is junk.
        let older = Layout { build: "older".into(), ..mine.clone() };
        fs::write(dir.path().join("b.snap"), encode(&older, &snapshot(&[7; 8], 2, 0.5, false)))
            .unwrap();
        fs::write(dir.path().join("c.snap"), b"not a snapshot").unwrap();
        let mut blocks = DiskBlocks::new(BS);
        let mut on_disk = Default::default();
        apply(&mut on_disk, &blocks.scan(dir.path(), &mine));
        let first = block_hash(None, &tokens[..4]);
        let second = block_hash(Some(first), &tokens[4..8]);
        assert_eq!(on_disk, [first, second].into_iter().collect());
        assert_eq!(blocks.held(), on_disk);
    }

    #[test]
    fn disk_blocks_hash_as_the_memory_tier_s_blocks_of_the_same_path() {
        let tokens: Vec<u32> = (100..108).collect();
        let mut blocks = DiskBlocks::new(BS);
        blocks.written("a.snap".into(), &tokens);
        let first = block_hash(None, &tokens[..4]);
        let second = block_hash(Some(first), &tokens[4..]);
        assert_eq!(blocks.held(), [first, second].into_iter().collect());
    }
}
