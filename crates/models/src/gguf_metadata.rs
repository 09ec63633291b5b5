//! Typed reads of a GGUF header's values (`{arch}.block_count`, `{arch}.rope.freq_base`, ...):
//! integers of any width, floats of either precision, and a missing or mistyped key named in
//! the error.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use crate::error::{ModelError, Result};

pub(crate) fn meta_str<'a>(meta: &'a HashMap<String, Value>, key: &str) -> Result<&'a str> {
    match meta.get(key) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(ModelError::MissingMetadata(key.to_string())),
    }
}

pub(crate) fn meta_usize(meta: &HashMap<String, Value>, key: &str) -> Result<usize> {
    let v = meta.get(key).ok_or_else(|| ModelError::MissingMetadata(key.to_string()))?;
    let n = v
        .to_u64()
        .or_else(|_| v.to_u32().map(u64::from))
        .or_else(|_| v.to_i32().map(|x| x.max(0) as u64));
    n.map(|n| n as usize).map_err(|_| ModelError::MissingMetadata(format!("{key} (as an integer)")))
}

pub(crate) fn meta_f64(meta: &HashMap<String, Value>, key: &str) -> Result<f64> {
    let v = meta.get(key).ok_or_else(|| ModelError::MissingMetadata(key.to_string()))?;
    v.to_f32()
        .map(f64::from)
        .or_else(|_| v.to_f64())
        .map_err(|_| ModelError::MissingMetadata(key.to_string()))
}
