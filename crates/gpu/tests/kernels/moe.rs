//! The router's choice on the device (`MoeRoute`) against the CPU's `Routing`: the same experts
//! for every token (planted ties go to the lower expert), listed in expert order, their
//! weights within a recorded bound, renormalised or not.

use spindle_gpu::{MoeRoute, MAX_TOP_K};
use spindle_models::Routing;

use crate::harness::{check, gpu_or_skip, rng, uniform};

/// Per weight (all at most 1): the device's `exp` against the CPU's, then the same sums and
/// divisions in the same order (measured on lavapipe: 1.2e-7).
const ROUTE_TOLERANCE: f64 = 1e-6;

#[test]
fn routing_picks_the_cpus_experts_with_its_weights() {
    let Some(gpu) = gpu_or_skip() else { return };
    let (tokens, experts) = (13, 10);
    let mut logits: Vec<f32> =
        uniform(&mut rng(7), tokens * experts).iter().map(|l| 4.0 * l).collect();
    // Token 0: experts 2 and 5 tie above the rest; token 1: every expert ties.
    logits[2] = 5.0;
    logits[5] = 5.0;
    logits[experts..2 * experts].fill(0.5);
    let rows: Vec<Vec<f32>> = logits.chunks(experts).map(<[f32]>::to_vec).collect();
    let route = MoeRoute::new(gpu).unwrap();
    let on_gpu = gpu.upload(&logits).unwrap();
    for (top_k, normalize) in [(1, false), (3, true), (3, false), (experts, true)] {
        let (ids, weights) = gpu
            .run(|step| {
                let routed = route.forward(step, &on_gpu, experts, top_k, normalize)?;
                Ok((step.read(&routed.ids), step.read(&routed.weights)))
            })
            .unwrap();
        // The experts are u32 values in the tensor's buffer.
        let ids: Vec<u32> = ids.values().unwrap().iter().map(|v| v.to_bits()).collect();
        let weights = weights.values().unwrap();
        let (mut want_ids, mut want) = (Vec::new(), Vec::new());
        for mut choices in Routing::from_logits(&rows, top_k, normalize).choices {
            // The CPU adds its experts' outputs in expert order; the kernel lists them so.
            choices.sort_by_key(|&(e, _)| e);
            want_ids.extend(choices.iter().map(|&(e, _)| e as u32));
            want.extend(choices.iter().map(|&(_, w)| w as f64));
        }
        assert_eq!(ids, want_ids, "top {top_k}: other experts chosen");
        let what = format!("top {top_k} of {experts}, renormalised {normalize}");
        check(&what, &weights, &want, &vec![1.0; want.len()], ROUTE_TOLERANCE);
    }
    for top_k in [0, experts + 1, MAX_TOP_K + 1] {
        let refused = gpu.run(|step| route.forward(step, &on_gpu, experts, top_k, true));
        assert!(refused.is_err(), "top {top_k} of {experts}");
    }
}
