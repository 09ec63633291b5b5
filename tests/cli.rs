//! The `spindle` command on bad input: a clear one-line `error:` naming the problem and a
//! non-zero exit, never a panic.

use std::path::{Path, PathBuf};
use std::process::Command;

use spindle_testkit::smollm2_gguf as smollm2;

/// Runs `spindle generate` and returns (success, stderr without log lines).
fn generate(model: &Path, extra: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["generate", "--model"])
        .arg(model)
        .args([
            "--prompt",
            "Hello there, how are you today?",
            "--max-tokens",
            "4",
            "--temperature",
            "0",
        ])
        .args(extra)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn assert_clean_error(stderr: &str, needle: &str) {
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one line: {stderr}");
    assert!(
        lines[0].starts_with("error: ") && lines[0].contains(needle),
        "{needle:?} not in {stderr}"
    );
}

fn patched_copy(dir: &Path, name: &str, patch: impl FnOnce(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(smollm2()).unwrap();
    patch(&mut bytes);
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack.windows(needle.len()).position(|w| w == needle).expect("pattern in GGUF header")
}

#[test]
fn a_good_model_generates() {
    let (ok, stderr) = generate(&smollm2(), &[]);
    assert!(ok, "{stderr}");
    assert!(stderr.contains("prompt tokens: 8, generated tokens: 4"), "{stderr}");
}

#[test]
fn missing_file_is_named() {
    let (ok, stderr) = generate(Path::new("/nonexistent/model.gguf"), &[]);
    assert!(!ok);
    assert_clean_error(&stderr, "/nonexistent/model.gguf");
}

#[test]
fn corrupt_file_is_not_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("junk.gguf");
    std::fs::write(&path, b"this is not a model at all, just some text").unwrap();
    let (ok, stderr) = generate(&path, &[]);
    assert!(!ok);
    assert_clean_error(&stderr, "not a valid GGUF file");
}

#[test]
fn truncated_file_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = patched_copy(dir.path(), "cut.gguf", |b| b.truncate(b.len() / 2));
    let (ok, stderr) = generate(&path, &[]);
    assert!(!ok);
    assert_clean_error(&stderr, "cut.gguf");
}

#[test]
fn unknown_architecture_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = patched_copy(dir.path(), "arch.gguf", |b| {
        // "general.architecture" = "llama" becomes "mamba" (same length).
        let at = find(b, b"general.architecture") + "general.architecture".len() + 4 + 8;
        b[at..at + 5].copy_from_slice(b"mamba");
    });
    let (ok, stderr) = generate(&path, &[]);
    assert!(!ok);
    assert_clean_error(&stderr, "unsupported architecture 'mamba'");
}

#[test]
fn unsupported_quantization_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = patched_copy(dir.path(), "quant.gguf", |b| {
        // Tensor info: name, u32 n_dims, n_dims × u64 dims, u32 ggml type (16 = IQ2_XXS).
        let name = b"blk.0.attn_q.weight";
        let at = find(b, name) + name.len();
        let n_dims = u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as usize;
        let ty = at + 4 + 8 * n_dims;
        b[ty..ty + 4].copy_from_slice(&16u32.to_le_bytes());
    });
    let (ok, stderr) = generate(&path, &[]);
    assert!(!ok);
    assert_clean_error(&stderr, "not supported");
}

#[test]
fn prompt_longer_than_the_context_is_refused() {
    let (ok, stderr) = generate(&smollm2(), &["--ctx-size", "4"]);
    assert!(!ok);
    assert_clean_error(&stderr, "context holds 4");
}

/// Runs `spindle serve` with `extra`, expecting it to refuse to start.
fn serve_refuses(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--model"])
        .arg(smollm2())
        .args(["--port", "0"])
        .args(extra)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve started with {extra:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_bad_guided_json_schema_stops_the_server_at_start() {
    assert_clean_error(
        &serve_refuses(&["--guided-json", "[1, 2]"]),
        "--guided-json must be a JSON schema object",
    );
    assert_clean_error(
        &serve_refuses(&["--guided-json", "{not json"]),
        "--guided-json is not JSON",
    );
    assert_clean_error(
        &serve_refuses(&["--guided-json", "@/nonexistent/schema.json"]),
        "/nonexistent/schema.json",
    );
    assert_clean_error(
        &serve_refuses(&["--guided-json", r#"{"type": "decimal"}"#]),
        "--guided-json can't be enforced",
    );
}

#[test]
fn a_draft_model_of_another_vocabulary_stops_the_server_at_start_naming_both() {
    let target = smollm2().file_stem().unwrap().to_string_lossy().into_owned();
    let stderr = serve_refuses(&["--draft-model", "gemma3-270m"]);
    assert_clean_error(&stderr, "the draft model gemma3-270m cannot draft for");
    assert!(stderr.contains(&target) && stderr.contains("vocabularies differ"), "{stderr}");
}

#[test]
fn a_sampling_flag_out_of_range_stops_the_server_at_start() {
    assert_clean_error(&serve_refuses(&["--temperature", "3"]), "--temperature");
    assert_clean_error(&serve_refuses(&["--top-p", "0"]), "--top-p");
    assert_clean_error(&serve_refuses(&["--repeat-penalty", "0"]), "--repeat-penalty");
}

#[test]
fn bench_prints_prefill_and_decode_speeds() {
    for figure in
        bench_row(&["--prompt-tokens", "16", "--decode-tokens", "4", "--repeats", "2"]).chunks(3)
    {
        let (median, min, max) = (figure[0], figure[1], figure[2]);
        assert!(min > 0.0 && min <= median && median <= max, "{figure:?}");
    }
}

#[test]
fn bench_measures_at_depth_and_concurrently_but_not_both_at_once() {
    // At depth the run fails unless the prefix came from the prefix cache; concurrently unless
    // no request shared another's prefix.
    for mode in [["--depth", "48"], ["--concurrent", "3"]] {
        let row = bench_row(&[
            "--prompt-tokens",
            "16",
            "--decode-tokens",
            "4",
            "--repeats",
            "1",
            mode[0],
            mode[1],
        ]);
        assert!(row.iter().all(|&speed| speed > 0.0), "{mode:?}: {row:?}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["bench", "--depth", "8", "--concurrent", "2"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert_clean_error(
        &String::from_utf8_lossy(&out.stderr),
        "--depth and --concurrent measure separately",
    );
}

/// `spindle bench --device gpu` runs the model on the GPU (lavapipe in CI; skipped without an
/// adapter unless CI is set) and says which adapter; its speeds are positive.
#[test]
fn bench_runs_on_the_gpu() {
    if let Err(e) = spindle_gpu::Gpu::open(None) {
        assert!(std::env::var_os("CI").is_none(), "CI is set and no GPU adapter opens: {e}");
        eprintln!("SKIPPED: {e}, and CI is unset");
        return;
    }
    let spindle_hub::ModelFiles::Safetensors { dir } = spindle_testkit::tiny_model() else {
        unreachable!("the tiny model is a safetensors folder")
    };
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["bench", "--device", "gpu", "--models"])
        .arg(&dir)
        .args(["--prompt-tokens", "8", "--decode-tokens", "4", "--repeats", "1"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.lines().any(|l| l.starts_with("GPU [")), "{stdout}");
    let row = stdout.lines().find(|l| l.starts_with(dir.to_str().unwrap())).expect("a row");
    let first = row[dir.as_os_str().len()..].split_whitespace().next().unwrap();
    assert!(first.parse::<f64>().unwrap() > 0.0, "{row}");
}

/// `spindle bench` on SmolLM2 with `args`, one thread: its row's prefill and decode tokens/s as
/// `median [min-max]`, six numbers.
fn bench_row(args: &[&str]) -> Vec<f64> {
    let model = smollm2();
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["bench", "--threads", "1", "--models"])
        .arg(&model)
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let row = stdout
        .lines()
        .find(|l| l.starts_with(model.to_str().unwrap()))
        .unwrap_or_else(|| panic!("no row for the model: {stdout}"));
    let numbers: Vec<f64> = row[model.as_os_str().len()..]
        .split(|c: char| " []-".contains(c))
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    assert_eq!(numbers.len(), 6, "{row}");
    numbers
}

#[test]
fn an_unknown_kv_cache_type_is_refused_with_the_known_ones() {
    let stderr = serve_refuses(&["--kv-cache-type", "q4_0"]);
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    assert!(
        stderr.starts_with("error: ")
            && stderr
                .contains("unknown KV cache type `q4_0`; expected one of f16, bf16, q8_0, f32"),
        "{stderr}"
    );
}

/// The startup line's "KV cache … of TYPE holds N tokens" for `--kv-cache-type kind` (no type:
/// the default), read before the server is stopped.
fn kv_summary(kind: Option<&str>) -> String {
    use std::io::BufRead;
    // SmolLM2-135M: 30 layers × 3 KV heads × 64; ten blocks of 16 positions in f32.
    let memory = (10 * 16 * 30 * 2 * 3 * 64 * 4).to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--model"])
        .arg(smollm2())
        .args(["--port", "0", "--kv-cache-memory", &memory])
        .args(kind.map(|k| ["--kv-cache-type", k]).iter().flatten())
        .env("RUST_LOG", "error")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let line = stderr.lines().map_while(Result::ok).find(|l| l.contains("KV cache"));
    child.kill().unwrap();
    child.wait().unwrap();
    line.unwrap_or_else(|| panic!("no KV cache line for {kind:?}"))
}

#[test]
fn the_kv_cache_type_sets_how_many_tokens_the_memory_holds() {
    // f16 by default: twice f32's tokens; q8_0 stores 34 bytes per 32 values (37 whole blocks).
    for (kind, type_name, tokens, kib) in [
        (None, "f16", 320, "22.5"),
        (Some("f32"), "f32", 160, "45.0"),
        (Some("bf16"), "bf16", 320, "22.5"),
        (Some("q8_0"), "q8_0", 592, "12.0"),
    ] {
        let line = kv_summary(kind);
        let expected = format!("of {type_name} holds {tokens} tokens, {kib} KiB per token");
        assert!(line.contains(&expected), "{expected:?} not in {line}");
    }
}

/// `spindle generate` on a copy of the tiny random model whose `generation_config.json` asks
/// for greedy decoding: (stdout, stderr).
fn generate_with_model_sampling(dir: &Path, extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["generate", "--model"])
        .arg(dir)
        .args(["--prompt", "Hello there", "--max-tokens", "8"])
        .args(extra)
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[test]
fn generate_takes_the_model_s_sampling_settings_unless_a_flag_overrides_them() {
    let spindle_hub::ModelFiles::Safetensors { dir: tiny } = spindle_testkit::tiny_model() else {
        unreachable!("the tiny model is a safetensors folder")
    };
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&tiny).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    let config = r#"{"temperature": 0.0, "top_k": 1}"#;
    std::fs::write(dir.path().join("generation_config.json"), config).unwrap();

    let (first, log) = generate_with_model_sampling(dir.path(), &["--seed", "1"]);
    let expected = "sampling: temperature 0 (generation_config.json), top_k 1 \
        (generation_config.json), top_p 1 (built-in)";
    assert!(log.contains(expected), "{expected:?} not in\n{log}");
    // Greedy, as the model asks: the seed changes nothing.
    let (second, _) = generate_with_model_sampling(dir.path(), &["--seed", "2"]);
    assert_eq!(first, second);
    let (_, log) = generate_with_model_sampling(dir.path(), &["--temperature", "0.5"]);
    let expected = "sampling: temperature 0.5 (--temperature), top_k 1 (generation_config.json)";
    assert!(log.contains(expected), "{expected:?} not in\n{log}");
}

#[test]
fn a_gpu_adapter_that_is_not_there_is_refused_naming_what_was_found() {
    // Index 99 exists on no machine: with lavapipe or a GPU the error lists the adapters found,
    // without any it says which backends were searched.
    let stderr = serve_refuses(&["--device", "gpu:99"]);
    assert_clean_error(&stderr, "--device: no GPU adapter: ");
    assert!(stderr.contains("found") || stderr.contains("none found through"), "{stderr}");
    let stderr = serve_refuses(&["--device", "tpu"]);
    assert!(stderr.contains("unknown device `tpu`; expected cpu, gpu or gpu:N"), "{stderr}");
}
