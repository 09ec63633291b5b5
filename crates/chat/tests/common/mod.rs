//! Shared by the integration tests: where the downloaded models live.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::{Content, Value};

/// The GGUF header of catalogue model `model` (file name `file`), pulled into
/// `$SPINDLE_HOME` on first use. Tests of one binary share a lock so a model is fetched once.
pub fn gguf_metadata(model: &str, file: &str) -> HashMap<String, Value> {
    static PULL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let path = {
        let _guard = PULL.lock().unwrap_or_else(|e| e.into_inner());
        match spindle_hub::resolve(model, &spindle_hub::spindle_home(), true) {
            Ok(spindle_hub::ModelFiles::Gguf(p)) => p,
            other => panic!("{model}: {other:?}"),
        }
    };
    assert_eq!(
        path.file_name().and_then(|n| n.to_str()),
        Some(file),
        "{model}: unexpected file {}",
        path.display()
    );
    let mut f = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `spindle pull {model}` first", path.display()));
    Content::read(&mut f).unwrap_or_else(|e| panic!("{}: {e}", path.display())).metadata
}
