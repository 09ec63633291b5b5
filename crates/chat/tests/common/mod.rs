//! Shared by the integration tests: where the downloaded models live.

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::quantized::gguf_file::{Content, Value};

/// The GGUF header of `$SPINDLE_HOME/models/<model>/<file>` (default `~/.cache/spindle`).
/// A missing model fails the test: CI pulls the models first, so absence is an error.
pub fn gguf_metadata(model: &str, file: &str) -> HashMap<String, Value> {
    let home = std::env::var_os("SPINDLE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").expect("HOME or SPINDLE_HOME must be set")).join(".cache/spindle")
    });
    let path = home.join("models").join(model).join(file);
    let mut f = std::fs::File::open(&path)
        .unwrap_or_else(|e| panic!("{}: {e}; run `spindle pull {model}` first", path.display()));
    Content::read(&mut f).unwrap_or_else(|e| panic!("{}: {e}", path.display())).metadata
}
