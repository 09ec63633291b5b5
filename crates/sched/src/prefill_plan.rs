//! How a prompt is cut into prefill chunks. The cuts depend on the prompt alone — every
//! `chunk` positions, plus the positions where the caller wants a snapshot (ends of chat
//! messages, end of the prompt) — never on load, because different cuts round differently and
//! the same request must give the same bits alone or in a crowd, cold or cached.
//!
//! A prompt can resume from a cached snapshot at `p` only if `p` is one of its own cuts and it
//! would have cut `0..p` exactly as the snapshot's writer did; [`PrefillPlan::key`] names that
//! chunking so the two can be compared.

/// The chunk ends of one prompt and where it leaves snapshots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillPlan {
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
        let chunk = chunk.max(1);
        let mut wanted: Vec<usize> = snapshots.iter().copied().filter(|&p| p > 0 && p < len).chain([len]).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let mut ends: Vec<usize> = (1..).map(|i| i * chunk).take_while(|&p| p < len).chain(wanted.iter().copied()).collect();
        ends.sort_unstable();
        ends.dedup();
        ends.retain(|&p| p > 0);
        Self { chunk, snapshots: wanted, ends }
    }

    pub fn len(&self) -> usize {
        self.ends.last().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions after which a snapshot is kept, ascending (the last is the prompt length).
    pub fn snapshots(&self) -> &[usize] {
        &self.snapshots
    }

    /// Sizes of the chunks that follow position `start`, which must be 0 or a chunk end.
    ///
    /// # Panics
    /// If `start` is neither: resuming there would cut the rest differently from a cold run.
    pub fn chunks_after(&self, start: usize) -> Vec<usize> {
        assert!(start == 0 || self.ends.contains(&start), "position {start} is not a cut of this prompt");
        let mut previous = start;
        self.ends
            .iter()
            .filter(|&&end| end > start)
            .map(|&end| end - std::mem::replace(&mut previous, end))
            .collect()
    }

    /// Names how this plan cuts positions `0..p` (`p` included as a cut); `None` when `p` is
    /// not a snapshot position of this plan. Equal keys at equal token prefixes mean a snapshot
    /// written by one prompt at `p` continues the other exactly.
    pub fn key(&self, p: usize) -> Option<u64> {
        if !self.snapshots.contains(&p) {
            return None;
        }
        let mut hash = Fnv::new();
        hash.write(self.chunk as u64);
        for &s in self.snapshots.iter().take_while(|&&s| s <= p) {
            hash.write(s as u64);
        }
        Some(hash.finish())
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
        // Positions that are not snapshot positions have no key.
        assert_eq!(a.key(256), None);
        assert_eq!(a.key(151), None);
        // The end of the prompt is a snapshot position.
        assert!(a.key(400).is_some());
        assert_ne!(a.key(390), a.key(400));
    }
}
