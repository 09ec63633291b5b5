//! `spindle serve --device gpu` on the tiny random model, on whatever adapter the machine has
//! (Mesa's lavapipe in CI): the model's steps run on the device, a repeated request resumes
//! from the prefix cache with the same answer (a partly filled block copied on the device), and
//! the disk tier saves a request's snapshots from the device and resumes them there after a
//! restart. A
//! tiny random hybrid GGUF runs on `GpuHybrid`: a request asking to speculate, with SmolLM2
//! drafting on the CPU, gives the CPU server's plain greedy answer (its rejected drafts
//! forgotten on the device), and its repeat resumes from the prefix cache; with its routed experts in system RAM (`--cpu-moe`) it answers
//! and prints the placement, whose budget names its source (`--gpu-memory-limit`, else the
//! device's heap); with `--n-gpu-layers` short of its blocks the first ones run on the CPU,
//! and the disk tier saves and resumes the keys of both sides.

use std::process::Command;

use crate::common::LoggedServer;

/// The tiny model's folder, or `None` (the test skipped) where no GPU adapter opens and CI is
/// unset; in CI a missing adapter fails, as the kernel tests do.
fn tiny_model_with_a_gpu() -> Option<String> {
    if let Err(e) = spindle_gpu::Gpu::open(None) {
        assert!(std::env::var_os("CI").is_none(), "CI is set and no GPU adapter opens: {e}");
        eprintln!("SKIPPED a GPU serve test: {e}, and CI is unset");
        return None;
    }
    let spindle_hub::ModelFiles::Safetensors { dir } = spindle_testkit::tiny_model() else {
        unreachable!("the tiny model is a safetensors folder")
    };
    Some(dir.to_str().unwrap().to_string())
}

/// The startup line about the placement in `log`, which must name where its budget came from.
fn placement_line(log: &str) -> &str {
    log.lines().find(|l| l.contains("placement: ")).unwrap_or_else(|| panic!("none in:\n{log}"))
}

/// A chat request of `max_tokens` after a system prompt whose cached part ends inside a block
/// of 16 (a snapshot at the end of the system message), so a request sharing it resumes on a
/// copy of that block; asking to speculate where `speculative`.
fn chat(user: &str, max_tokens: u32, speculative: bool) -> String {
    let mut body = serde_json::json!({
        "messages": [
            {"role": "system", "content": "You are a careful assistant that answers in one word. \
                Here is a long system prompt to share across requests."},
            {"role": "user", "content": user},
        ],
        "max_tokens": max_tokens,
        "temperature": 0,
        "chat_template_kwargs": {"enable_thinking": false},
    });
    if speculative {
        body["speculative"] = true.into();
    }
    body.to_string()
}

/// The request most tests send.
fn hi() -> String {
    chat("Hi there", 3, false)
}

/// [`hi`] with another user message: the same system prompt, so it resumes where that ends
/// (inside a block).
fn good_morning() -> String {
    chat("Good morning", 3, false)
}

/// [`hi`] asking to speculate, for one token more.
fn speculative_hi() -> String {
    chat("Hi there", 4, true)
}

#[test]
fn a_request_on_the_gpu_answers_alike_cold_and_from_the_prefix_cache() {
    let Some(model) = tiny_model_with_a_gpu() else { return };
    let server = LoggedServer::with_args(&["--model", &model, "--device", "gpu"]);
    let cold = server.post_ok("/v1/chat/completions", &hi());
    let cached = server.post_ok("/v1/chat/completions", &hi());
    let log = server.stop();
    let log = String::from_utf8_lossy(&log);
    assert!(log.contains("model steps run here"), "no GPU line in:\n{log}");
    assert!(log.contains("keys and values in f16 on the device"), "the default, in:\n{log}");
    let text = |answer: &serde_json::Value| answer["choices"][0]["message"]["content"].clone();
    assert_eq!(cold["usage"]["completion_tokens"], 3, "{cold}");
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{cold}");
    let hit = cached["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(
        hit > 0 && !hit.is_multiple_of(16),
        "resumed at {hit}: inside a block, so one was copied"
    );
    assert_eq!(text(&cold), text(&cached), "the cached run answers as the cold one");
}

/// `--kv-cache-memory auto` (the default) sizes the pools from the device's memory and what one
/// buffer binding holds, not from system RAM (whose 70% made lavapipe's 128 MiB bindings fail
/// every request); a size past what the bindings hold is refused at start, naming the flag.
#[test]
fn the_kv_pool_on_the_gpu_is_sized_to_the_device() {
    let Some(model) = tiny_model_with_a_gpu() else { return };
    let args = ["--model", &model, "--device", "gpu", "--kv-cache-memory", "auto"];
    let server = LoggedServer::with_args(&args);
    let answer = server.post_ok("/v1/chat/completions", &hi());
    let log = server.stop();
    let log = String::from_utf8_lossy(&log);
    assert_eq!(answer["usage"]["completion_tokens"], 3, "{answer}");
    let gpu = spindle_gpu::Gpu::open(None).unwrap();
    let line = log.lines().find(|l| l.contains("KV cache ")).expect("the model's line");
    eprintln!("{line}");
    assert!(line.contains("(auto)"), "{line}");
    let output = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--model", &model, "--device", "gpu", "--port", "0"])
        .args(["--kv-cache-memory", "512GiB"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    let binding = gpu.max_binding_bytes() as f64 / (1 << 20) as f64;
    for needle in ["--kv-cache-memory 512.0 GiB", &format!("the {binding:.1} MiB"), "at most"] {
        assert!(stderr.contains(needle), "{needle} not in: {stderr}");
    }
}

/// The disk tier with the GPU: a request's snapshots are saved from the device's keys and
/// values (and a hybrid's DeltaNet states), and after a restart on the same folder the repeat
/// resumes from them (read into the device) with the same answer, as does a request sharing
/// only its system prompt (resumed inside a block) with the answer of a cold server. On the
/// tiny dense model and the tiny hybrid.
#[test]
fn the_disk_tier_resumes_requests_on_the_gpu_after_a_restart() {
    let Some(dense) = tiny_model_with_a_gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hybrid = tiny_hybrid(dir.path());
    for model in [dense.as_str(), hybrid.to_str().unwrap()] {
        disk_tier_across_a_restart(model, &[]);
    }
}

/// Runs [`the_disk_tier_resumes_requests_on_the_gpu_after_a_restart`]'s checks on `model`
/// served with `extra` arguments; returns the cold answer and the first server's log.
fn disk_tier_across_a_restart(model: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let cold_args = [["--model", model, "--device", "gpu"].as_slice(), extra].concat();
    let cold_server = LoggedServer::with_args(&cold_args);
    let other_cold = cold_server.post_ok("/v1/chat/completions", &good_morning());
    cold_server.stop();
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().to_str().unwrap();
    let args = [["--prefix-cache-dir", folder].as_slice(), &cold_args].concat();
    let mut first = LoggedServer::with_args(&args);
    let cold = first.post_ok("/v1/chat/completions", &hi());
    // The snapshots go to disk in the background; a drain (SIGTERM) finishes their writes.
    first.signal(libc::SIGTERM);
    let status = first.wait_for_exit(std::time::Duration::from_secs(120));
    let first_log = first.log();
    assert!(status.success(), "{status}:\n{first_log}");
    let files = walk_files(dir.path());
    let snapshots = files.iter().filter(|p| p.extension().is_some_and(|e| e == "snap"));
    assert!(snapshots.count() >= 2, "{files:?}");
    let restarted = LoggedServer::with_args(&args);
    let warm = restarted.post_ok("/v1/chat/completions", &hi());
    let other = restarted.post_ok("/v1/chat/completions", &good_morning());
    restarted.stop();
    let text = |answer: &serde_json::Value| answer["choices"][0]["message"]["content"].clone();
    let cached = |answer: &serde_json::Value| {
        answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    eprintln!("{model}: resumed {} and {} tokens from the disk", cached(&warm), cached(&other));
    assert_eq!(cached(&warm), cold["usage"]["prompt_tokens"].as_u64().unwrap(), "{warm}");
    assert_eq!(text(&cold), text(&warm), "the resumed run answers as the cold one");
    assert!(cached(&other) > 0 && !cached(&other).is_multiple_of(16), "{other}");
    assert_eq!(text(&other), text(&other_cold), "resumed inside a block, as a cold server");
    (cold, first_log)
}

/// Every file under `dir`, at any depth.
fn walk_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk_files(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn a_kv_cache_type_the_gpu_does_not_store_is_refused_naming_it() {
    let Some(model) = tiny_model_with_a_gpu() else { return };
    let output = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--model", &model, "--device", "gpu", "--port", "0"])
        .args(["--kv-cache-type", "q8_0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    for needle in ["--kv-cache-type q8_0", "--device gpu", "f16"] {
        assert!(stderr.contains(needle), "{needle} not in: {stderr}");
    }
}

/// A tiny random Qwen3.5-MoE GGUF (`HybridShape::TINY`, one block) in `dir`, with SmolLM2's
/// tokenizer and chat template so the chat endpoint renders and decodes its tokens.
fn tiny_hybrid(dir: &std::path::Path) -> std::path::PathBuf {
    tiny_hybrid_shaped(dir, &spindle_models::random_hybrid::HybridShape::TINY)
}

fn tiny_hybrid_shaped(
    dir: &std::path::Path,
    shape: &spindle_models::random_hybrid::HybridShape,
) -> std::path::PathBuf {
    use candle_core::quantized::gguf_file;
    use spindle_models::random_hybrid::write_random_hybrid;
    let mut source = std::fs::File::open(crate::common::smollm2()).unwrap();
    let content = gguf_file::Content::read(&mut source).unwrap();
    let tokenizer = content.metadata.into_iter().filter(|(k, _)| k.starts_with("tokenizer."));
    let path = dir.join(shape.file_name(1));
    let mut file = std::fs::File::create(&path).unwrap();
    write_random_hybrid(&mut file, shape, 1, tokenizer.collect()).unwrap();
    path
}

/// `(drafted, accepted)` of each request's line in `log`.
fn drafts_per_request(log: &str) -> Vec<(u64, u64)> {
    let field = |line: &str, name: &str| -> u64 {
        let value = line.split(&format!(" {name}=")).nth(1).and_then(|v| v.split(' ').next());
        value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    let requests = log.lines().filter(|l| l.contains("request done"));
    requests.map(|l| (field(l, "drafted"), field(l, "accepted"))).collect()
}

#[test]
fn a_hybrid_on_the_gpu_speculates_to_the_cpus_plain_answer_and_resumes_from_the_prefix_cache() {
    if tiny_model_with_a_gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_hybrid(dir.path());
    let model = model.to_str().unwrap();
    let text = |answer: &serde_json::Value| answer["choices"][0]["message"]["content"].clone();
    let cpu = LoggedServer::with_args(&["--model", model, "--no-speculate"]);
    let expected = cpu.post_ok("/v1/chat/completions", &speculative_hi());
    cpu.stop();
    let draft = crate::common::smollm2();
    let draft = draft.to_str().unwrap();
    // Room for the states of drafted positions (an eighth of the target's KV memory holds
    // them) beside the draft model's pool.
    let args =
        ["--model", model, "--device", "gpu", "--draft-model", draft, "--kv-cache-memory", "1GiB"];
    let server = LoggedServer::with_args(&args);
    let cold = server.post_ok("/v1/chat/completions", &speculative_hi());
    let cached = server.post_ok("/v1/chat/completions", &speculative_hi());
    let log = server.stop();
    let log = String::from_utf8_lossy(&log);
    // SmolLM2 drafts for a random model: most drafts are rejected, so the states go back.
    let (drafted, accepted) = drafts_per_request(&log)[0];
    assert!(drafted > accepted, "drafted {drafted}, accepted {accepted}:\n{log}");
    eprintln!("drafted {drafted}, accepted {accepted}");
    // No --gpu-memory-limit: the budget is what the device reports free (Vulkan's heap).
    let source = match spindle_gpu::Gpu::open(None).unwrap().memory() {
        Some(memory) => format!("({}: ", memory.source),
        None => "(no budget: ".to_string(),
    };
    let line = placement_line(&log);
    assert!(line.contains("every routed expert on the GPU") && line.contains(&source), "{line}");
    assert_eq!(cold["usage"]["completion_tokens"], 4, "{cold}");
    assert_eq!(text(&cold), text(&expected), "the GPU's greedy answer is the CPU's");
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{cold}");
    let hit = cached["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(hit > 0, "the repeat resumed from the prefix cache: {cached}");
    assert_eq!(text(&cold), text(&cached), "the cached run answers as the cold one");
}

/// `--spec-mtp` on the GPU: the file's MTP head goes on the device (the placement line says
/// so) and drafts there, and the answer is the CPU server's plain greedy one.
#[test]
fn a_hybrid_on_the_gpu_drafts_with_its_mtp_head_to_the_cpus_plain_answer() {
    if tiny_model_with_a_gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let shape = spindle_models::random_hybrid::HybridShape::TINY_MTP;
    let model = tiny_hybrid_shaped(dir.path(), &shape);
    let model = model.to_str().unwrap();
    let text = |answer: &serde_json::Value| answer["choices"][0]["message"]["content"].clone();
    let cpu = LoggedServer::with_args(&["--model", model, "--no-speculate"]);
    let expected = cpu.post_ok("/v1/chat/completions", &speculative_hi());
    cpu.stop();
    let args = ["--model", model, "--device", "gpu", "--spec-mtp", "3"];
    let server = LoggedServer::with_args(&args);
    let answer = server.post_ok("/v1/chat/completions", &speculative_hi());
    let log = server.stop();
    let log = String::from_utf8_lossy(&log);
    assert!(placement_line(&log).contains("MTP head included"), "{}", placement_line(&log));
    let (drafted, accepted) = drafts_per_request(&log)[0];
    eprintln!("drafted {drafted}, accepted {accepted}");
    assert!(drafted > 0, "no drafts:\n{log}");
    assert_eq!(text(&answer), text(&expected), "the GPU's greedy answer is the CPU's");
}

#[test]
fn a_hybrid_with_its_experts_in_system_ram_answers_and_prints_the_placement() {
    if tiny_model_with_a_gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_hybrid(dir.path());
    let model = model.to_str().unwrap();
    let args = ["--model", model, "--device", "gpu", "--cpu-moe", "--gpu-memory-limit", "1GiB"];
    let server = LoggedServer::with_args(&args);
    let spilled = server.post_ok("/v1/chat/completions", &hi());
    let log = server.stop();
    let log = String::from_utf8_lossy(&log);
    let line = placement_line(&log);
    assert!(line.contains("routed experts of blocks 0-3 (4 of 4 MoE blocks"), "{line}");
    // The limit given is the budget, whatever the device reports.
    assert!(line.contains("(--gpu-memory-limit 1024.0 MiB; a sixteenth kept"), "{line}");
    // The tokens against the all-GPU run are the kernel tests' (placement.rs); a random Q4_K
    // model's near-ties would make text equality here a test of rounding.
    assert_eq!(spilled["usage"]["completion_tokens"], 3, "{spilled}");
}

/// `--n-gpu-layers 2` of the tiny hybrid's 4 blocks: blocks 0 and 1 run whole on the CPU (the
/// placement line says so), and the disk tier saves snapshots whose keys and values come from
/// both the host pool and the device's, and resumes them after a restart with the same
/// answers. (The tokens against the all-GPU run are the kernel tests' (first_blocks.rs), on
/// an f32 model: this random Q4_K one's near-ties would make text equality with another
/// placement a test of the CPU kernels' 8-bit activations.)
#[test]
fn a_hybrid_with_its_first_blocks_on_the_cpu_answers_and_resumes_from_disk() {
    if tiny_model_with_a_gpu().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_hybrid(dir.path());
    let (cold, log) = disk_tier_across_a_restart(model.to_str().unwrap(), &["--n-gpu-layers", "2"]);
    let line = placement_line(&log);
    let split = "blocks 0-1 whole on the CPU, the last 2 on the GPU (as --n-gpu-layers 2)";
    assert!(line.contains(split), "{line}");
    assert_eq!(cold["usage"]["completion_tokens"], 3, "{cold}");
}

/// SmolLM2's GGUF under `--gpu-memory-limit 80MiB` (--fit, the default): everything but its
/// blocks and the KV pool's share fit only with 20 of its 30 blocks whole on the CPU, which
/// the placement line says as the `--n-gpu-layers` it is; a repeat resumes from the prefix
/// cache with the same answer. A checkpoint folder, whose bytes the placement does not read,
/// refuses the flag, naming it.
#[test]
fn a_dense_model_fitted_with_its_first_blocks_on_the_cpu_answers_alike_cold_and_cached() {
    let Some(checkpoint) = tiny_model_with_a_gpu() else { return };
    let model = crate::common::smollm2();
    let model = model.to_str().unwrap();
    let args = ["--model", model, "--device", "gpu", "--gpu-memory-limit", "80MiB"];
    let server = LoggedServer::with_args(&args);
    let cold = server.post_ok("/v1/chat/completions", &hi());
    let cached = server.post_ok("/v1/chat/completions", &hi());
    let log = server.stop();
    let log = String::from_utf8_lossy(&log);
    let line = placement_line(&log);
    let split = "placement: blocks 0-19 whole on the CPU, the last 10 on the GPU (as \
                 --n-gpu-layers 10); ";
    assert!(line.contains(split), "{line}");
    let text = |answer: &serde_json::Value| answer["choices"][0]["message"]["content"].clone();
    let hit = cached["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(hit > 0, "the repeat resumed from the prefix cache: {cached}");
    assert_eq!(text(&cold), text(&cached), "the cached run answers as the cold one");
    let output = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["serve", "--device", "gpu", "--port", "0", "--n-gpu-layers", "1", "--model"])
        .arg(&checkpoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("--n-gpu-layers: a checkpoint folder runs whole on the GPU"),
        "{stderr}"
    );
}

/// Same seed ⇒ same bytes on the GPU, whatever else runs: a sampled request (seed, log
/// probabilities) alone and cold, then again among 1, 4 and 16 other requests at once (each its
/// own user text, cold) while it is served from the prefix cache: the same text and the same
/// log probabilities every time. On the tiny dense model and the tiny hybrid.
#[test]
fn a_seeded_request_on_the_gpu_answers_alike_alone_and_among_up_to_16_others() {
    let Some(dense) = tiny_model_with_a_gpu() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hybrid = tiny_hybrid(dir.path());
    let mut seeded: serde_json::Value = serde_json::from_str(&chat("Hi there", 6, false)).unwrap();
    seeded["temperature"] = 0.9.into();
    seeded["seed"] = 1234.into();
    seeded["logprobs"] = true.into();
    let seeded = seeded.to_string();
    let answer = |reply: &serde_json::Value| {
        let choice = &reply["choices"][0];
        (choice["message"]["content"].clone(), choice["logprobs"].clone())
    };
    for model in [dense.as_str(), hybrid.to_str().unwrap()] {
        let args = ["--model", model, "--device", "gpu", "--max-concurrent", "17"];
        let server = LoggedServer::with_args(&args);
        let cold = server.post_ok("/v1/chat/completions", &seeded);
        let prompt_tokens = cold["usage"]["prompt_tokens"].clone();
        assert!(answer(&cold).1["content"].as_array().is_some_and(|t| t.len() == 6), "{cold}");
        for others in [1, 4, 16] {
            let replies: Vec<serde_json::Value> = std::thread::scope(|scope| {
                let server = &server;
                let seeded = &seeded;
                let mine = scope.spawn(move || server.post_ok("/v1/chat/completions", seeded));
                let theirs: Vec<_> = (0..others)
                    .map(|i| {
                        let user = format!("Question {i}: {}", "why? ".repeat(i % 5));
                        let body = chat(&user, 4 + i as u32 % 3, false);
                        scope.spawn(move || server.post_ok("/v1/chat/completions", &body))
                    })
                    .collect();
                let mut replies = vec![mine.join().unwrap()];
                replies.extend(theirs.into_iter().map(|t| t.join().unwrap()));
                replies
            });
            let mine = &replies[0];
            assert_eq!(answer(mine), answer(&cold), "{model}: among {others} others");
            let cached = &mine["usage"]["prompt_tokens_details"]["cached_tokens"];
            assert_eq!(cached, &prompt_tokens, "{model}: served from the cache in full: {mine}");
        }
        server.stop();
    }
}
