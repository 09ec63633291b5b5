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
    let has_weights = entries
        .filter_map(Result::ok)
        .any(|e| e.path().extension().is_some_and(|x| x == "safetensors") && e.path().is_file());
    if !has_weights {
        return Err(HubError::NoSafetensors(path.to_path_buf()));
    }
    Ok(ModelFiles::Safetensors { dir: path.to_path_buf() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model_folder(files: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for file in files {
            fs::write(dir.path().join(file), b"{}").unwrap();
        }
        dir
    }

    #[test]
    fn gguf_file_resolves_to_itself() {
        let dir = model_folder(&["m.GGUF", "notes.txt"]);
        let gguf = dir.path().join("m.GGUF");
        assert_eq!(resolve_path(&gguf).unwrap(), ModelFiles::Gguf(gguf));
        let txt = dir.path().join("notes.txt");
        assert!(matches!(resolve_path(&txt), Err(HubError::UnsupportedPath(p)) if p == txt));
    }

    #[test]
    fn complete_folder_resolves_to_safetensors() {
        let dir =
            model_folder(&["config.json", "tokenizer.json", "model-00001-of-00002.safetensors"]);
        let expected = ModelFiles::Safetensors { dir: dir.path().to_path_buf() };
        assert_eq!(resolve_path(dir.path()).unwrap(), expected);
    }

    #[test]
    fn incomplete_folders_name_what_is_missing() {
        let dir = model_folder(&["config.json", "model.safetensors"]);
        let err = resolve_path(dir.path()).unwrap_err();
        assert!(matches!(err, HubError::MissingFile { file: "tokenizer.json", .. }), "{err}");
        assert!(err.to_string().ends_with("has no tokenizer.json"), "{err}");

        let dir = model_folder(&["tokenizer.json", "model.safetensors"]);
        let err = resolve_path(dir.path()).unwrap_err();
        assert!(matches!(err, HubError::MissingFile { file: "config.json", .. }), "{err}");

        let dir = model_folder(&["config.json", "tokenizer.json"]);
        assert!(matches!(resolve_path(dir.path()), Err(HubError::NoSafetensors(_))));
    }
}
