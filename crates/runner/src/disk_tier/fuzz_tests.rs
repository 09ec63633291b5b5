//! Fuzzing the disk tier's reader (issue #20): snapshot files truncated, bit-flipped, or
//! damaged and then resealed with a fresh checksum (so the damage reaches the header checks and
//! the payload reads behind the checksum). A file may be refused, or accepted only when it
//! re-encodes to exactly its own bytes; `DiskTier::load` of a damaged file gives a snapshot of
//! the asked-for prompt or nothing (deleting the file), never a panic.
//!
//! `SPINDLE_FUZZ_CASES=100000` runs a long campaign; the default is CI's fixed subset.

use spindle_fuzz::{mutate_bytes, Rng};

use super::snapshot_file::DIGEST;
use super::*;

const CI_CASES: u64 = 5_000;

fn layout() -> Layout {
    Layout {
        fingerprint: "fuzz-model".into(),
        build: "fuzz-build".into(),
        kv_type: "q8_0".into(),
        block_size: 4,
        block_bytes: 10,
        recurrent_floats: 3,
    }
}

/// A valid snapshot of up to 9 tokens, with or without logits.
fn snapshot(rng: &mut Rng) -> StoredSnapshot {
    let layout = layout();
    let tokens: Vec<u32> = (0..rng.below(10)).map(|_| rng.next_u64() as u32 % 50_000).collect();
    let blocks = (0..tokens.len().div_ceil(layout.block_size))
        .map(|_| (0..layout.block_bytes).map(|_| rng.next_u64() as u8).collect())
        .collect();
    StoredSnapshot {
        tokens,
        key: rng.next_u64(),
        blocks,
        recurrent: vec![1.0, -0.0, f32::NAN],
        logits: rng.one_in(2).then(|| vec![0.5; 1 + rng.below(5)]),
    }
}

/// A damaged file and the snapshot it was made from.
#[derive(Debug)]
struct Case {
    original: StoredSnapshot,
    bytes: Vec<u8>,
}

fn generate(rng: &mut Rng) -> Case {
    let original = snapshot(rng);
    let mut bytes = encode(&layout(), &original);
    mutate_bytes(rng, &mut bytes);
    if rng.one_in(2) && bytes.len() >= DIGEST {
        // Resealed: what a writer with a bug (not a bad disk) would leave.
        let body = bytes.len() - DIGEST;
        let digest = Sha256::digest(&bytes[..body]);
        bytes[body..].copy_from_slice(&digest);
    }
    Case { original, bytes }
}

#[test]
fn damaged_snapshot_files_are_refused_or_read_exactly() {
    let root = tempfile::tempdir().unwrap();
    let config = DiskConfig { dir: root.path().to_path_buf(), bytes: 1 << 20 };
    let tier = DiskTier::open(&config, layout(), None).unwrap();
    let mut accepted = 0u64;
    let cases = spindle_fuzz::run("disk tier", CI_CASES, generate, |case| {
        if let Ok(decoded) = decode(&case.bytes, &layout()) {
            accepted += 1;
            assert_eq!(encode(&layout(), &decoded), case.bytes, "accepted bytes must round-trip");
        }
        let (tokens, key) = (&case.original.tokens, case.original.key);
        let path = tier.dir.join(file_name(tokens, key, &layout().kv_type));
        fs::write(&path, &case.bytes).unwrap();
        match tier.load(tokens, key) {
            Some(loaded) => assert_eq!((&loaded.tokens, loaded.key), (tokens, key)),
            None => assert!(!path.exists(), "a refused file must be deleted"),
        }
        let _ = fs::remove_file(&path);
    });
    // Some damage must leave a valid file (a resealed flip inside the KV bytes), or the
    // generator would test the refusals only.
    if cases >= 1_000 {
        assert!(accepted > 0, "no damaged file was accepted in {cases} cases");
    }
}
