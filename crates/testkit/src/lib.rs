//! Fixtures shared by the crates' tests. [`smollm2_gguf`] is the real default model's file,
//! pulled on first use. [`tiny_model`] is a whole model the engine runs in
//! milliseconds a step and that no test needs to download: two layers of width 32 with random
//! weights (fixed seed) beside Qwen3's tokenizer and chat template from the chat crate's
//! fixtures (thinking, Hermes tool calls). Its output head favours JSON's closing tokens, so
//! that the strings, numbers and objects a grammar opens end within a few tokens.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use spindle_hub::ModelFiles;
use spindle_models::random_dense::{write_random_dense, DenseShape};

/// Bumped whenever the written bytes change, so a folder from an older writer is not reused.
const REVISION: u32 = 1;

/// JSON's closing tokens, which the tiny model favours.
const CLOSERS: [&str; 6] = ["\"", "\",", "\"}", "}", ",", "]"];

/// The folder of Qwen3's tokenizer fixtures.
fn qwen3_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../chat/tests/data/qwen3")
}

/// The tiny model's folder, written on first use under the system's temporary folder and kept
/// there for later test runs.
pub fn tiny_model() -> ModelFiles {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("spindle-tiny-random-qwen3-r{REVISION}"));
        if !dir.join("model.safetensors").exists() {
            write_tiny_model(&dir);
        }
        dir
    });
    ModelFiles::Safetensors { dir: dir.clone() }
}

/// Writes the model aside and renames it into place, so a test process running alongside never
/// reads half a folder; when another process got there first, its copy (the same bytes) stays.
fn write_tiny_model(dir: &Path) {
    let staging = dir.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).expect("create the tiny model's folder");
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(qwen3_fixtures().join(file), staging.join(file))
            .unwrap_or_else(|e| panic!("copy {file}: {e}"));
    }
    let tokenizer = spindle_chat::Tokenizer::from_tokenizer_json(&staging.join("tokenizer.json"))
        .expect("Qwen3's tokenizer fixture");
    let closers: Vec<u32> =
        CLOSERS.iter().map(|t| tokenizer.token_to_id(t).expect("a JSON closer")).collect();
    let shape = DenseShape::tiny(tokenizer.vocab_size());
    write_random_dense(&staging, &shape, 37, &closers).expect("write the tiny model");
    if std::fs::rename(&staging, dir).is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
}

/// SmolLM2-135M's GGUF, pulled into `$SPINDLE_HOME` on first use; the lock keeps a process's
/// parallel tests from fetching it twice.
pub fn smollm2_gguf() -> PathBuf {
    static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
    let files = spindle_hub::resolve(
        "smollm2-135m",
        &spindle_hub::spindle_home(),
        spindle_hub::WhenMissing::Download,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    match files {
        ModelFiles::Gguf(path) => path,
        other => panic!("SmolLM2 is a GGUF file, not {other:?}"),
    }
}
