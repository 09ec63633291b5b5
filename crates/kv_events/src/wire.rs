//! The msgpack encoding of an event batch, as vLLM's msgspec structs (`array_like`, tagged)
//! write it: a batch is `[ts, [events], dp_rank]`, an event an array whose first element is its
//! tag: `["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium]`,
//! `["BlockRemoved", hashes, medium]`, `["AllBlocksCleared"]`.

/// A block's identity in the stream: the same hash in a later `BlockRemoved` names the block
/// a `BlockStored` announced. llm-d hashes the token ids itself; it maps these to its own keys.
pub type BlockHash = u64;

/// Where a block is kept, named as vLLM names its tiers (`MEDIUM_GPU`, `MEDIUM_STORAGE` in
/// `vllm/distributed/kv_events.py`), since routers weigh a block by those names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// The KV pool the model computes from. vLLM calls that tier "GPU" whatever the device
    /// (its CPU backend too), and routers give it full credit; "CPU" means a host tier a block
    /// must first be copied back from, which Spindle's pool is not.
    Pool,
    /// The prefix cache's disk tier: loaded back before use.
    Disk,
}

impl Medium {
    pub fn name(self) -> &'static str {
        match self {
            Medium::Pool => "GPU",
            Medium::Disk => "STORAGE",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KvEvent {
    /// Blocks that entered the cache, each the child of the one before it (the first of
    /// `parent`); `token_ids` holds `block_size` ids per block.
    BlockStored {
        hashes: Vec<BlockHash>,
        parent: Option<BlockHash>,
        token_ids: Vec<u32>,
        block_size: usize,
        medium: Medium,
    },
    BlockRemoved {
        hashes: Vec<BlockHash>,
        medium: Medium,
    },
    /// Every block is gone (the cache was dropped).
    AllBlocksCleared,
}

/// `[ts, [events], dp_rank]` with no data-parallel rank (nil).
pub fn encode_batch(timestamp: f64, events: &[KvEvent]) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing to a Vec cannot fail.
    let w = &mut out;
    rmp::encode::write_array_len(w, 3).expect("in memory");
    rmp::encode::write_f64(w, timestamp).expect("in memory");
    rmp::encode::write_array_len(w, events.len() as u32).expect("in memory");
    for event in events {
        encode_event(w, event);
    }
    rmp::encode::write_nil(w).expect("in memory");
    out
}

fn encode_event(w: &mut Vec<u8>, event: &KvEvent) {
    let hashes = |w: &mut Vec<u8>, hashes: &[BlockHash]| {
        rmp::encode::write_array_len(w, hashes.len() as u32).expect("in memory");
        for &hash in hashes {
            rmp::encode::write_uint(w, hash).expect("in memory");
        }
    };
    match event {
        KvEvent::BlockStored { hashes: stored, parent, token_ids, block_size, medium } => {
            rmp::encode::write_array_len(w, 7).expect("in memory");
            rmp::encode::write_str(w, "BlockStored").expect("in memory");
            hashes(w, stored);
            match parent {
                Some(parent) => drop(rmp::encode::write_uint(w, *parent).expect("in memory")),
                None => rmp::encode::write_nil(w).expect("in memory"),
            }
            rmp::encode::write_array_len(w, token_ids.len() as u32).expect("in memory");
            for &token in token_ids {
                rmp::encode::write_uint(w, token.into()).expect("in memory");
            }
            rmp::encode::write_uint(w, *block_size as u64).expect("in memory");
            // No LoRA adapters.
            rmp::encode::write_nil(w).expect("in memory");
            rmp::encode::write_str(w, medium.name()).expect("in memory");
        }
        KvEvent::BlockRemoved { hashes: removed, medium } => {
            rmp::encode::write_array_len(w, 3).expect("in memory");
            rmp::encode::write_str(w, "BlockRemoved").expect("in memory");
            hashes(w, removed);
            rmp::encode::write_str(w, medium.name()).expect("in memory");
        }
        KvEvent::AllBlocksCleared => {
            rmp::encode::write_array_len(w, 1).expect("in memory");
            rmp::encode::write_str(w, "AllBlocksCleared").expect("in memory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_the_array_vllm_writes() {
        let events = [
            KvEvent::BlockStored {
                hashes: vec![7],
                parent: None,
                token_ids: vec![1, 2],
                block_size: 2,
                medium: Medium::Pool,
            },
            KvEvent::BlockRemoved { hashes: vec![7], medium: Medium::Disk },
            KvEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch(1.5, &events);
        let mut expected = vec![0x93, 0xcb];
        expected.extend(1.5f64.to_be_bytes());
        expected.push(0x93);
        expected.extend([0x97, 0xab]);
        expected.extend(b"BlockStored");
        expected.extend([0x91, 7, 0xc0, 0x92, 1, 2, 2, 0xc0, 0xa3]);
        expected.extend(b"GPU");
        expected.extend([0x93, 0xac]);
        expected.extend(b"BlockRemoved");
        expected.extend([0x91, 7, 0xa7]);
        expected.extend(b"STORAGE");
        expected.extend([0x91, 0xb0]);
        expected.extend(b"AllBlocksCleared");
        expected.push(0xc0);
        assert_eq!(bytes, expected);
    }
}
