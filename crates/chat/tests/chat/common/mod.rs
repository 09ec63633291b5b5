//! Shared by the integration tests: where the downloaded models live.

use spindle_chat::GgufMetadata;

/// The GGUF header of catalogue model `model` (file name `file`), pulled into
/// `$SPINDLE_HOME` on first use. Tests of one binary share a lock so a model is fetched once.
pub fn gguf_metadata(model: &str, file: &str) -> GgufMetadata {
    static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let path = {
        let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
        spindle_hub::pull(model, &spindle_hub::spindle_home())
            .unwrap_or_else(|e| panic!("{model}: {e}"))
    };
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some(file),
        "{model}: unexpected file {}",
        path.display()
    );
    spindle_chat::read_tokenizer_metadata(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}
