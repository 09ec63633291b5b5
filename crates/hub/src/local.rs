//! Model specs that are paths: a `.gguf` file, or a Hugging Face style folder with `config.json`,
//! `tokenizer.json` and `*.safetensors` weights.

use std::fs;
use std::path::Path;

use crate::error::HubError;
use crate::ModelFiles;

/// Classifies an existing path, saying what is missing when it is not a usable model.
pub(crate) fn resolve_path(path: &Path) -> Result<ModelFiles, HubError> {
    if path.is_file() {
        let is_gguf = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        return if is_gguf {
            Ok(ModelFiles::Gguf(path.to_path_buf()))
        } else {
            Err(HubError::UnsupportedPath(path.to_path_buf()))
        };
    }
    if !path.is_dir() {
        return Err(HubError::PathNotFound(path.to_path_buf()));
    }
    for file in ["config.json", "tokenizer.json"] {
        if !path.join(file).is_file() {
            return Err(HubError::MissingFile { dir: path.to_path_buf(), file });
        }
    }
    let entries = fs::read_dir(path).map_err(HubError::io(path))?;
    let has_weights = entries.filter_map(Result::ok).any(|e| {
        e.path().extension().is_some_and(|x| x == "safetensors") && e.path().is_file()
    });
    if !has_weights {
        return Err(HubError::NoSafetensors(path.to_path_buf()));
    }
    Ok(ModelFiles::Safetensors { dir: path.to_path_buf() })
}
