//! What a hybrid MoE's decode can reach on a GPU at most: each token reads every dense weight
//! and, per MoE block, its top-k experts' share of the routed experts, from wherever the
//! placement put them (the blocks `--n-gpu-layers` leaves on the CPU read all theirs there). Given the device's (and the host's) memory bandwidth, that bounds the
//! tokens per second; `spindle bench --device gpu` prints the measured decode as a share of it,
//! the figure the targets are set in (≥ 60% all on the GPU; with `--cpu-moe`, ≥ 80% of
//! what the host's bandwidth allows for the experts).

use spindle_gpu::{ModelBytes, Placement};

/// Bytes one decoded token reads, by where they live.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TokenBytes {
    pub device: f64,
    pub host: f64,
}

impl TokenBytes {
    /// For a hybrid of `bytes` placed as `placement`, routing `top_k` of `experts` per block.
    pub fn of(bytes: &ModelBytes, placement: &Placement, (top_k, experts): (usize, usize)) -> Self {
        let share = top_k as f64 / experts.max(1) as f64;
        let on_cpu = bytes.cpu_weights(placement.cpu_blocks);
        let device = (bytes.dense - on_cpu) as f64;
        let mut token = TokenBytes { device, host: on_cpu as f64 };
        for (block, &experts) in bytes.experts.iter().enumerate() {
            let read = experts as f64 * share;
            if placement.experts_on_host(block) {
                token.host += read;
            } else {
                token.device += read;
            }
        }
        token
    }

    /// Tokens per second the bandwidths (GB/s) allow: the slower side bounds it (the host's
    /// experts run between the device's submissions, so the two add up in time).
    pub fn roofline(&self, device_gbs: f64, host_gbs: Option<f64>) -> f64 {
        let device_s = self.device / (device_gbs * 1e9);
        let host_s = match host_gbs {
            Some(gbs) => self.host / (gbs * 1e9),
            None => 0.0,
        };
        1.0 / (device_s + host_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_gpu::PlacementRequest;

    #[test]
    fn a_token_reads_the_dense_weights_and_its_share_of_the_experts() {
        // 1000 dense bytes, 4 blocks of 800 expert bytes, top 2 of 8: 200 a block a token.
        let bytes = ModelBytes {
            dense: 1000,
            experts: vec![800; 4],
            states_per_sequence: 0,
            draft_head: 0,
            block_weights: vec![100; 4],
            block_mixers: vec![spindle_models::Mixer::Linear; 4],
        };
        let all = Placement::plan(&bytes, &PlacementRequest::default()).unwrap();
        let on_device = TokenBytes::of(&bytes, &all, (2, 8));
        assert_eq!(on_device, TokenBytes { device: 1800.0, host: 0.0 });
        // 1.8 kB a token at 1.8 kB/µs... in GB/s: 1.8e-6 GB at 1 GB/s is 1.8 µs.
        assert!((on_device.roofline(1.0, None) - 1e9 / 1800.0).abs() < 1e-3);
        let request = PlacementRequest { n_cpu_moe: 3, ..PlacementRequest::default() };
        let spilled = Placement::plan(&bytes, &request).unwrap();
        let split = TokenBytes::of(&bytes, &spilled, (2, 8));
        assert_eq!(split, TokenBytes { device: 1200.0, host: 600.0 });
        // 1200 B at 2 GB/s and 600 B at 1 GB/s: 0.6 + 0.6 µs a token.
        assert!((split.roofline(2.0, Some(1.0)) - 1e9 / 1200.0).abs() < 1e-3);
        // Blocks 0 and 1 on the CPU: their 100 B each and their experts' share read there.
        let request = PlacementRequest { n_gpu_layers: Some(2), ..PlacementRequest::default() };
        let layers = Placement::plan(&bytes, &request).unwrap();
        let on_cpu = TokenBytes::of(&bytes, &layers, (2, 8));
        assert_eq!(on_cpu, TokenBytes { device: 800.0 + 400.0, host: 200.0 + 400.0 });
    }
}
