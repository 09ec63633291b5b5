//! `--kv-cache-memory`: a size, or `auto` for a share of the memory still free once the weights
//! are loaded.

use std::str::FromStr;

/// What `--kv-cache-memory` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvMemory {
    Bytes(usize),
    Auto,
}

/// Share (in tenths) of the available memory the KV pool and the snapshots may take together;
/// the rest is left for activations, the tokenizer, the OS and other processes.
const AUTO_TENTHS: usize = 7;
const AUTO_MIN: usize = 256 << 20;
/// Where available memory cannot be read (not Linux).
const AUTO_FALLBACK: usize = 2 << 30;

impl FromStr for KvMemory {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if text.trim().eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        crate::byte_size::parse_bytes(text).map(Self::Bytes)
    }
}

impl KvMemory {
    /// The pool's bytes; `auto` reads /proc/meminfo now, so call it after the weights are loaded.
    pub fn resolve(self, snapshot_bytes: usize) -> usize {
        match self {
            Self::Bytes(bytes) => bytes,
            Self::Auto => auto_bytes(mem_available(), snapshot_bytes),
        }
    }
}

/// 70% of `available` less what the snapshots may take, at least 256 MiB; 2 GiB when unknown.
fn auto_bytes(available: Option<usize>, snapshot_bytes: usize) -> usize {
    match available {
        Some(available) => {
            (available / 10 * AUTO_TENTHS).saturating_sub(snapshot_bytes).max(AUTO_MIN)
        }
        None => AUTO_FALLBACK,
    }
}

/// `auto` with several models: an even share of `budget` (what they may take together) for
/// each model's KV pool once all their weights and snapshots are counted, so that every one of
/// them fits at once; at least 256 MiB each (then fewer fit, and the least recently used idle
/// one is unloaded for a load).
pub fn shared_bytes(budget: u64, weights: &[u64], snapshot_bytes: usize) -> usize {
    let models = weights.len().max(1) as u64;
    let taken = weights.iter().sum::<u64>() + models * snapshot_bytes as u64;
    (budget.saturating_sub(taken) / models).max(AUTO_MIN as u64) as usize
}

/// `MemAvailable` of /proc/meminfo in bytes: free memory plus what the kernel can reclaim.
fn mem_available() -> Option<usize> {
    parse_mem_available(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn parse_mem_available(meminfo: &str) -> Option<usize> {
    let line = meminfo.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: usize = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kib << 10)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_takes_seventy_percent_of_available_less_snapshots() {
        assert_eq!(auto_bytes(Some(10 << 30), 1 << 30), 6 << 30);
        assert_eq!(auto_bytes(Some(100 << 20), 1 << 30), 256 << 20, "never below 256 MiB");
        assert_eq!(auto_bytes(None, 1 << 30), 2 << 30, "unknown memory falls back to 2 GiB");
    }

    #[test]
    fn several_models_share_what_their_weights_and_snapshots_leave() {
        let gib = 1u64 << 30;
        // 10 GiB less 1 + 3 GiB of weights and 2 × 512 MiB of snapshots, in two.
        assert_eq!(shared_bytes(10 * gib, &[gib, 3 * gib], 512 << 20), (5 * gib / 2) as usize);
        assert_eq!(shared_bytes(gib, &[gib, gib], 0), 256 << 20, "never below 256 MiB");
    }

    #[test]
    fn meminfo_gives_available_bytes() {
        let meminfo =
            "MemTotal:       131072000 kB\nMemFree:         2048 kB\nMemAvailable:   1048576 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(1 << 30));
        assert_eq!(parse_mem_available("MemTotal: 5 kB\n"), None);
    }

    #[test]
    fn the_flag_takes_auto_or_a_size() {
        assert_eq!("auto".parse(), Ok(KvMemory::Auto));
        assert_eq!("512MiB".parse(), Ok(KvMemory::Bytes(512 << 20)));
        assert!("lots".parse::<KvMemory>().unwrap_err().contains("not a size"));
    }
}
