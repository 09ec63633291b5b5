//! Teacher-forced comparison of a model with llama.cpp's greedy tokens for SmolLM2
//! (tests/data/reference/smollm2-135m.json), for tests that load the same weights another way.

use std::path::PathBuf;

use spindle_models::CausalLm;

pub struct Fixture {
    pub gguf: PathBuf,
    doc: serde_json::Value,
}

impl Fixture {
    pub fn smollm2() -> Self {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let text = std::fs::read_to_string(root.join("tests/data/reference/smollm2-135m.json")).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
        // Pulled on first use; tests of one binary share a lock so it is fetched once.
        static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let gguf = {
            let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
            match spindle_hub::resolve("smollm2-135m", &spindle_hub::spindle_home(), true) {
                Ok(spindle_hub::ModelFiles::Gguf(p)) => p,
                other => panic!("smollm2-135m: {other:?}"),
            }
        };
        assert!(gguf.ends_with(doc["gguf_file"].as_str().unwrap()));
        Self { gguf, doc }
    }

    /// Feeds llama.cpp's tokens back in and checks our top-1 at every step: a difference is
    /// accepted only at a near-tie (≤ `near_tie` nats) of llama.cpp's own distribution or where
    /// it reported no logprobs, and at least `min_agreement` of all steps must agree exactly.
    pub fn assert_follows(&self, model: &dyn CausalLm, near_tie: f64, min_agreement: f64) {
        let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
        let (mut steps, mut agree) = (0usize, 0usize);
        for g in self.doc["generations"].as_array().unwrap() {
            let mut cache = model.new_cache(2048);
            let mut logits = model.forward(&ids(&g["prompt_ids"]), &mut cache).unwrap();
            for (step, expected) in ids(&g["greedy_ids"]).into_iter().enumerate() {
                let ours = (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best }) as u32;
                steps += 1;
                agree += usize::from(ours == expected);
                let top = &g["top_logprobs"][step];
                if ours != expected && !top.is_null() {
                    let lp = |id: u32| top.as_array()?.iter().find(|p| p[0] == id).and_then(|p| p[1].as_f64());
                    let gap = lp(expected).zip(lp(ours)).map(|(a, b)| a - b);
                    assert!(gap.is_some_and(|g| g <= near_tie), "prompt {:?} step {step}: {ours} vs llama.cpp {expected} (gap {gap:?})", g["prompt"]);
                }
                logits = model.forward(&[expected], &mut cache).unwrap();
            }
        }
        assert!(agree as f64 >= steps as f64 * min_agreement, "only {agree} of {steps} steps agree with llama.cpp");
    }
}
