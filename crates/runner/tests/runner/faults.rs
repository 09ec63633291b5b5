//! An engine survives its own faults: a panic injected at each stage of a step fails (at most)
//! the requests of that step, their blocks go back, and the next request runs as on a fresh
//! engine; a fault while recovering stops the engine and says so. Runs on the tiny hybrid
//! fixture with Qwen3's tokenizer: no download.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use spindle_chat::{ChatTemplate, Tokenizer};
use spindle_runner::{
    sequence_channel, CacheConfig, Engine, EngineConfig, FaultInjection, ModelBundle, RunnerError,
    SequenceEvent, StepStage,
};

use crate::common::request;

fn tiny() -> Arc<ModelBundle> {
    static BUNDLE: OnceLock<Arc<ModelBundle>> = OnceLock::new();
    BUNDLE
        .get_or_init(|| {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
            let model =
                spindle_models::load_safetensors(&root.join("tests/data/hybrid/qwen3_5_moe"))
                    .unwrap();
            let tokenizer = root.join("crates/chat/tests/data/qwen3/tokenizer.json");
            let tokenizer = Tokenizer::from_tokenizer_json(&tokenizer).unwrap();
            let bundle = ModelBundle {
                model,
                tokenizer: tokenizer.into(),
                template: ChatTemplate::chatml(),
                fingerprint: "tiny".into(),
                sampling: Default::default(),
            };
            Arc::new(bundle)
        })
        .clone()
}

/// Faults armed at some stages: each strikes once, the next time the engine reaches it.
#[derive(Default)]
struct Armed {
    stages: std::sync::Mutex<Vec<StepStage>>,
    struck: AtomicBool,
}

impl Armed {
    fn arm(&self, stage: StepStage) {
        self.struck.store(false, Ordering::SeqCst);
        self.stages.lock().unwrap().push(stage);
    }

    fn strike(&self, stage: StepStage) {
        let mut stages = self.stages.lock().unwrap();
        if let Some(at) = stages.iter().position(|&s| s == stage) {
            stages.remove(at);
            drop(stages);
            self.struck.store(true, Ordering::SeqCst);
            panic!("injected fault at {stage:?}");
        }
    }
}

fn engine(armed: &Arc<Armed>) -> Engine {
    let cache = CacheConfig {
        kv_bytes: 8 << 20,
        snapshot_bytes: 8 << 20,
        block_size: 16,
        ..CacheConfig::default()
    };
    let armed = armed.clone();
    let config = EngineConfig {
        prefill_chunk: 32,
        step_tokens: 64,
        fault_injection: Some(FaultInjection(Arc::new(move |stage| armed.strike(stage)))),
        ..EngineConfig::new(2, cache)
    };
    Engine::start(tiny(), config)
}

/// How a request ended: its tokens, or its error (`None`: dropped with the step it was in).
type Ending = Result<Vec<u32>, Option<RunnerError>>;

fn generate(engine: &Engine, prompt: &[u32]) -> Ending {
    let (caller, mut inbox) = sequence_channel();
    engine.submit(request(prompt, 6, 200), caller).unwrap();
    let mut tokens = Vec::new();
    loop {
        match inbox.blocking_recv() {
            None => return Err(None),
            Some(SequenceEvent::Token { token, .. }) => tokens.push(token.id),
            Some(SequenceEvent::Finished(_)) => return Ok(tokens),
            Some(SequenceEvent::Failed(error)) => return Err(Some(error)),
            Some(SequenceEvent::Prefilled { .. }) => {}
        }
    }
}

/// A prompt of `len` ids inside the fixture's vocabulary of 512.
fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + salt) % 500 + 1).collect()
}

#[test]
fn a_fault_at_any_stage_fails_at_most_its_step_and_the_next_request_runs_as_on_a_fresh_engine() {
    let reference = generate(&engine(&Arc::default()), &prompt(40, 3)).unwrap();
    for stage in [StepStage::Admit, StepStage::Begin, StepStage::Forward, StepStage::End] {
        let armed = Arc::new(Armed::default());
        let engine = engine(&armed);
        armed.arm(stage);
        let struck = generate(&engine, &prompt(40, 9));
        assert!(armed.struck.load(Ordering::SeqCst), "{stage:?} was never reached");
        match (stage, &struck) {
            // Admission is tried again once the engine has recovered.
            (StepStage::Admit, Ok(tokens)) => assert_eq!(tokens.len(), 6),
            (StepStage::Begin | StepStage::Forward, Err(Some(RunnerError::Internal(message)))) => {
                assert!(message.contains("injected fault"), "{stage:?}: {message}")
            }
            (StepStage::End, Err(Some(RunnerError::Internal(_)) | None)) => {}
            other => panic!("{other:?}"),
        }
        let after = generate(&engine, &prompt(40, 3));
        assert!(
            after.as_ref().is_ok_and(|tokens| *tokens == reference),
            "after {stage:?}: {after:?}"
        );
        assert_eq!(*engine.health().borrow(), None, "{stage:?}");
    }
}

#[test]
fn a_fault_while_recovering_stops_the_engine_and_its_health_says_so() {
    let armed = Arc::new(Armed::default());
    let engine = engine(&armed);
    armed.arm(StepStage::End);
    armed.arm(StepStage::Recover);
    assert!(generate(&engine, &prompt(20, 1)).is_err());
    let mut health = engine.health();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reason = runtime.block_on(health.wait_for(Option::is_some)).unwrap().clone();
    assert!(reason.unwrap().contains("injected fault at Recover"));
    // A stopped engine takes no more work.
    let (caller, _inbox) = sequence_channel();
    assert!(engine.submit(request(&prompt(4, 1), 2, 200), caller).is_err());
}
