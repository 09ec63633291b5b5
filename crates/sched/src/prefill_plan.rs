//! How a prompt is cut into prefill chunks. The cuts depend on the prompt alone — every
//! `chunk` positions, plus the positions where the caller wants a snapshot (ends of chat
//! messages, end of the prompt) — never on load, because different cuts round differently and
//! the same request must give the same bits alone or in a crowd, cold or cached.
//!
//! On a model with recurrent layers the cuts change the bits (the chunked delta rule rounds per
//! chunk): a prompt can resume from a cached snapshot at `p` only if `p` is one of its own cuts
//! and it would have cut `0..p` exactly as the snapshot's writer did; [`PrefillPlan::key`] names
//! that chunking so the two can be compared. On an attention-only model every kernel computes a
//! row alone and attention adds its keys in position order wherever a chunk starts, so the cuts
//! change nothing ([`CacheKind::AttentionOnly`]): any position is a place to resume, and all keys are equal.

use crate::CacheKind;

/// The key of every position of an attention-only model: all chunkings compute the same bits.
const FREE_KEY: u64 = 0;

/// The chunk ends of one prompt and where it leaves snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillPlan {
    kind: CacheKind,
    chunk: usize,
    /// Requested snapshot positions within the prompt, ascending, always ending with its length.
    snapshots: Vec<usize>,
    /// Chunk ends, ascending; the last is the prompt length.
    ends: Vec<usize>,
}

impl PrefillPlan {
    /// The plan for a prompt of `len` tokens cut every `chunk` positions and at `snapshots`
    /// (positions outside `1..=len` are ignored; `len` itself is always one).
    pub fn new(len: usize, snapshots: &[usize], chunk: usize) -> Self {
        Self::for_model(CacheKind::Hybrid, len, snapshots, chunk)
    }

    /// [`Self::new`] for a model of `kind`: cuts change the bits only where it is hybrid.
    pub fn for_model(kind: CacheKind, len: usize, snapshots: &[usize], chunk: usize) -> Self {
        let chunk = chunk.max(1);
        let mut wanted: Vec<usize> =
            snapshots.iter().copied().filter(|&p| p > 0 && p < len).chain([len]).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut ends: Vec<usize> = (1..)
            .map(|i| i * chunk)
            .take_while(|&p| p < len)
            .chain(wanted.iter().copied())
            .collect();
        ends.sort_unstable();
        ends.dedup();
        ends.retain(|&p| p > 0);
        Self { kind, chunk, snapshots: wanted, ends }
    }

    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The last position before `p` (and within the prompt) that [`Self::chunks_after`] can
    /// resume from, if any: a cut, or on an attention-only model any position.
    pub fn last_cut_before(&self, p: usize) -> Option<usize> {
        match self.kind {
            CacheKind::Hybrid => self.ends.iter().rev().copied().find(|&end| end < p),
            CacheKind::AttentionOnly => {
                Some(p.saturating_sub(1).min(self.len())).filter(|&p| p > 0)
            }
        }
    }

    /// Positions after which a snapshot is kept, ascending (the last is the prompt length).
    pub fn snapshots(&self) -> &[usize] {
        &self.snapshots
    }

    /// Sizes of the chunks that follow position `start`, which must be 0 or a chunk end unless
    /// the model is attention-only (then the rest keeps the plan's later cuts).
    ///
    /// # Panics
    /// If cuts matter and `start` is neither: resuming there would cut the rest differently from
    /// a cold run.
    pub fn chunks_after(&self, start: usize) -> Vec<usize> {
        assert!(
            start == 0 || self.kind == CacheKind::AttentionOnly || self.ends.contains(&start),
            "position {start} is not a cut of this prompt"
        );
        let mut previous = start;
        self.ends
            .iter()
            .filter(|&&end| end > start)
            .map(|&end| end - std::mem::replace(&mut previous, end))
            .collect()
    }

    /// Names how this plan cuts positions `0..p` (`p` included as a cut); `None` when `p` is
    /// not a cut of this plan. Equal keys at equal token prefixes mean a snapshot written by one
    /// prompt at `p` continues the other exactly. The cuts before `p` are the chunk multiples
    /// and the snapshot positions before it, so those name them; at a snapshot position this is
    /// the hash of the snapshot positions up to it, also when a chunk multiple falls there.
    /// On an attention-only model every position has the one key all plans share.
    pub fn key(&self, p: usize) -> Option<u64> {
        if self.kind == CacheKind::AttentionOnly {
            return Some(FREE_KEY);
        }
        if !self.ends.contains(&p) {
            return None;
        }
        let mut hash = Fnv::new();
        hash.write(self.chunk as u64);
        for &s in self.snapshots.iter().take_while(|&&s| s < p) {
            hash.write(s as u64);
        }
        hash.write(p as u64);
        Some(hash.finish())
    }

    /// Names the cuts that determined the keys and values of positions `0..block_end`: the chunk
    /// size and every cut up to and including the end of the chunk that computed position
    /// `block_end - 1` (which may lie past `block_end`). Blocks of two prompts with the same
    /// tokens hold the same bits exactly when their keys are equal too.
    ///
    /// For a full block `block_end` is its end; for the last, partly filled block of a prefix it
    /// is the prefix's length. On an attention-only model every block has the one key all plans
    /// share.
    pub fn block_key(&self, block_end: usize) -> u64 {
        if self.kind == CacheKind::AttentionOnly {
            return FREE_KEY;
        }
        let mut hash = Fnv::new();
        hash.write(self.chunk as u64);
        for &end in &self.ends {
            hash.write(end as u64);
            if end >= block_end {
                break;
            }
        }
        hash.finish()
    }

    /// [`Self::block_key`] of each block of `0..len` (`len.div_ceil(block_size)` keys), the last
    /// ending at `len`.
    pub fn block_keys(&self, len: usize, block_size: usize) -> Vec<u64> {
        (1..=len.div_ceil(block_size)).map(|i| self.block_key((i * block_size).min(len))).collect()
    }
}

/// 64-bit FNV-1a: stable across builds and platforms, so keys can also name files on disk.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, value: u64) {
        for byte in value.to_le_bytes() {
            self.0 = (self.0 ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_every_chunk_and_at_each_snapshot() {
        let plan = PrefillPlan::new(600, &[150, 256, 590, 0, 700], 256);
        assert_eq!(plan.snapshots(), &[150, 256, 590, 600]);
        assert_eq!(plan.chunks_after(0), vec![150, 106, 256, 78, 10]);
        assert_eq!(plan.chunks_after(150), vec![106, 256, 78, 10]);
        assert_eq!(plan.chunks_after(590), vec![10]);
        assert_eq!(plan.chunks_after(600), Vec::<usize>::new());
        assert_eq!(plan.len(), 600);
    }

    #[test]
    fn the_last_cut_before_a_position() {
        let plan = PrefillPlan::new(600, &[150], 256);
        assert_eq!(plan.last_cut_before(150), None);
        assert_eq!(plan.last_cut_before(151), Some(150));
        assert_eq!(plan.last_cut_before(300), Some(256));
        assert_eq!(plan.last_cut_before(601), Some(600));
    }

    #[test]
    fn a_prompt_shorter_than_a_chunk_is_one_chunk() {
        let plan = PrefillPlan::new(5, &[], 256);
        assert_eq!(plan.chunks_after(0), vec![5]);
        assert_eq!(plan.snapshots(), &[5]);
    }

    #[test]
    #[should_panic(expected = "not a cut")]
    fn resuming_between_cuts_is_refused() {
        PrefillPlan::new(600, &[150], 256).chunks_after(100);
    }

    #[test]
    fn keys_match_only_for_the_same_cuts_before_the_position() {
        // Same system prompt (ends at 150), different user turns.
        let a = PrefillPlan::new(400, &[150, 390], 256);
        let b = PrefillPlan::new(500, &[150, 470], 256);
        assert_eq!(a.key(150), b.key(150));
        assert!(a.key(150).is_some());
        // A prompt with an extra cut before 150 chunks 0..150 differently.
        let c = PrefillPlan::new(500, &[100, 150], 256);
        assert_ne!(a.key(150), c.key(150));
        // Another chunk size cuts differently too.
        assert_ne!(a.key(150), PrefillPlan::new(400, &[150], 128).key(150));
        // Positions that are not cuts have no key.
        assert_eq!(a.key(151), None);
        assert_eq!(a.key(300), None);
        // A chunk cut has one (a dropped prefill keeps its state there), the same as a plan's
        // that asks for a snapshot at that cut, and another than a plan's that cut before it.
        assert!(a.key(256).is_some());
        assert_eq!(a.key(256), PrefillPlan::new(300, &[150, 256], 256).key(256));
        assert_ne!(a.key(256), PrefillPlan::new(300, &[100, 150], 256).key(256));
        // The end of the prompt is a snapshot position.
        assert!(a.key(400).is_some());
        assert_ne!(a.key(390), a.key(400));
    }

    #[test]
    fn block_keys_name_the_cuts_up_to_the_chunk_that_computed_the_block() {
        // Cuts 150, 256 | 400, 500 and 150, 256 | 470, 512, 600: equal up to 256.
        let a = PrefillPlan::new(500, &[150, 400], 256);
        let b = PrefillPlan::new(600, &[150, 470], 256);
        // Blocks computed by the chunks 0..150 and 150..256 share their keys.
        for end in [16, 144, 150, 160, 256] {
            assert_eq!(a.block_key(end), b.block_key(end), "block ending at {end}");
        }
        // The block ending at 272 was computed by 256..400 in one, by 256..470 in the other.
        assert_ne!(a.block_key(272), b.block_key(272));
        assert_ne!(a.block_key(400), b.block_key(400));

        // An extra cut inside the chunk that computed the block: another key, even for a block
        // that ends before that cut.
        let c = PrefillPlan::new(500, &[100, 150, 400], 256);
        assert_ne!(a.block_key(96), c.block_key(96));
        assert_ne!(a.block_key(144), c.block_key(144));
        // A cut after that chunk does not matter.
        let d = PrefillPlan::new(500, &[150, 200, 400], 256);
        assert_eq!(a.block_key(144), d.block_key(144));
        assert_eq!(a.block_key(150), d.block_key(150));
        assert_ne!(a.block_key(160), d.block_key(160));

        // The chunk that computed the block may end after it: a cut between the block's end and
        // the chunk's end matters, as does the end of a shorter prompt.
        let short = PrefillPlan::new(40, &[], 32);
        let long = PrefillPlan::new(50, &[], 32);
        assert_eq!(short.block_key(16), long.block_key(16));
        assert_eq!(short.block_key(32), long.block_key(32));
        assert_ne!(short.block_key(40), long.block_key(48));
        let cut = PrefillPlan::new(50, &[25], 32);
        assert_ne!(long.block_key(16), cut.block_key(16), "chunk 0..32 against 0..25");
        // Another chunk size, the same cuts so far: still another key.
        assert_ne!(
            PrefillPlan::new(20, &[], 32).block_key(16),
            PrefillPlan::new(20, &[], 64).block_key(16)
        );

        assert_eq!(
            a.block_keys(150, 16),
            (1..=10).map(|i| a.block_key((i * 16).min(150))).collect::<Vec<_>>()
        );
        assert_eq!(a.block_keys(0, 16), Vec::<u64>::new());
    }

    #[test]
    fn attention_only_plans_resume_anywhere_under_one_key() {
        let free = |len, snapshots: &[usize]| {
            PrefillPlan::for_model(CacheKind::AttentionOnly, len, snapshots, 256)
        };
        let a = free(600, &[150]);
        // The same chunks as a plan whose cuts matter...
        assert_eq!(a.chunks_after(0), PrefillPlan::new(600, &[150], 256).chunks_after(0));
        // ... but any position is a place to resume, the rest keeping the later cuts.
        assert_eq!(a.chunks_after(79), vec![71, 106, 256, 88]);
        assert_eq!(a.chunks_after(300), vec![212, 88]);
        assert_eq!(a.last_cut_before(80), Some(79));
        assert_eq!(a.last_cut_before(1), None);
        assert_eq!(a.last_cut_before(700), Some(600));
        // Every position and block shares one key with every other plan.
        let b = free(300, &[17, 40]);
        for p in [1, 16, 79, 150, 256, 300] {
            assert_eq!(a.key(p), b.key(p));
            assert!(a.key(p).is_some());
            assert_eq!(a.block_key(p), b.block_key(p));
        }
    }
}
