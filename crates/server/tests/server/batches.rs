//! The Batch API on a real server: files uploaded, batches run to their output and error
//! files through the same chat path as live requests, listed, cancelled and resumed after a
//! restart; live requests keep going first; and the official `openai` Python client drives it.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    chat_body, client, fresh_dir, post, python_with, run_python_script, server, start_stoppable,
    start_with, Setup,
};
use serde_json::{json, Value};

/// A multipart upload of `contents` as `purpose`.
async fn upload(base: &str, purpose: &str, contents: &[u8]) -> (u16, Value) {
    let boundary = "spindle-test-boundary";
    let mut body = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\n{purpose}\r\n\
         --{boundary}\r\ncontent-disposition: form-data; name=\"file\"; filename=\"requests.jsonl\"\r\n\
         content-type: application/jsonl\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(contents);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let response = client()
        .post(format!("{base}/v1/files"))
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

async fn get(base: &str, path: &str) -> (u16, Value) {
    let response = client().get(format!("{base}{path}")).send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}")))
}

/// A file's lines, parsed.
async fn content(base: &str, file_id: &str) -> Vec<Value> {
    let response = client().get(format!("{base}/v1/files/{file_id}/content")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn request_line(custom_id: &str, body: Value) -> String {
    json!({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})
        .to_string()
}

fn jsonl(lines: &[String]) -> Vec<u8> {
    lines.iter().map(|l| format!("{l}\n")).collect::<String>().into_bytes()
}

async fn create_batch(base: &str, file_id: &str) -> Value {
    let body = json!({"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h", "metadata": {"job": "test"}});
    let (status, batch) = post(base, "/v1/batches", &body).await;
    assert_eq!(status, 200, "{batch}");
    batch
}

/// Polls batch `id` until its status is `want` (10 minutes at most: 2 shared cores).
async fn wait_for(base: &str, id: &str, want: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let (status, batch) = get(base, &format!("/v1/batches/{id}")).await;
        assert_eq!(status, 200, "{batch}");
        if batch["status"] == want {
            return batch;
        }
        assert!(
            Instant::now() < deadline
                && !["failed", "completed", "cancelled"]
                    .contains(&batch["status"].as_str().unwrap()),
            "{batch}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each line's `custom_id`, checking none is answered twice.
fn custom_ids(lines: &[Value]) -> Vec<String> {
    let mut ids: Vec<String> =
        lines.iter().map(|l| l["custom_id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    let mut unique = ids.clone();
    unique.dedup();
    assert_eq!(unique, ids, "a custom_id was answered twice");
    ids
}

#[tokio::test]
async fn a_batch_answers_every_request_once_as_live_requests_are_answered() {
    let base = server(Setup::Default);
    let questions = ["What is the capital of France?", "Name a primary colour.", "What is 2 + 2?"];
    let mut lines: Vec<String> = questions
        .iter()
        .enumerate()
        .map(|(i, q)| request_line(&format!("q{i}"), chat_body(q, 12)))
        .collect();
    // A line of the right shape whose body is no chat request: it fails alone.
    lines.insert(1, request_line("bad", json!({"messages": "not a list"})));
    let (status, file) = upload(&base, "batch", &jsonl(&lines)).await;
    assert_eq!(status, 200, "{file}");
    assert_eq!((file["object"].as_str(), file["purpose"].as_str()), (Some("file"), Some("batch")));
    let batch = create_batch(&base, file["id"].as_str().unwrap()).await;
    assert_eq!(batch["object"], "batch");
    assert_eq!(batch["request_counts"], json!({"total": 4, "completed": 0, "failed": 0}));
    assert_eq!(batch["metadata"], json!({"job": "test"}));

    let done = wait_for(&base, batch["id"].as_str().unwrap(), "completed").await;
    assert_eq!(done["request_counts"], json!({"total": 4, "completed": 3, "failed": 1}));
    for stamp in ["in_progress_at", "finalizing_at", "completed_at"] {
        assert!(
            done[stamp].as_u64().unwrap() >= batch["created_at"].as_u64().unwrap(),
            "{stamp}: {done}"
        );
    }
    let output = content(&base, done["output_file_id"].as_str().unwrap()).await;
    assert_eq!(custom_ids(&output), ["q0", "q1", "q2"]);
    for line in &output {
        assert!(
            line["id"].as_str().unwrap().starts_with("batch_req_") && line["error"].is_null(),
            "{line}"
        );
        assert_eq!(line["response"]["status_code"], 200);
        let body = &line["response"]["body"];
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(line["response"]["request_id"], body["id"]);
    }
    // Greedy: the batch's answer is the one a live request gets.
    let (status, live) = post(&base, "/v1/chat/completions", &chat_body(questions[2], 12)).await;
    assert_eq!(status, 200);
    let batched = output.iter().find(|l| l["custom_id"] == "q2").unwrap();
    assert_eq!(
        batched["response"]["body"]["choices"][0]["message"]["content"],
        live["choices"][0]["message"]["content"]
    );

    let errors = content(&base, done["error_file_id"].as_str().unwrap()).await;
    assert_eq!(custom_ids(&errors), ["bad"]);
    assert_eq!(errors[0]["response"]["status_code"], 400);
    assert!(errors[0]["error"]["message"].as_str().unwrap().contains("messages"), "{}", errors[0]);
    assert_eq!(errors[0]["response"]["body"]["error"]["type"], "invalid_request_error");
    // The body's field at fault, named by its path within the body.
    assert_eq!(errors[0]["response"]["body"]["error"]["param"], "messages");

    let (_, output_file) =
        get(&base, &format!("/v1/files/{}", done["output_file_id"].as_str().unwrap())).await;
    assert_eq!(output_file["purpose"], "batch_output");
}

#[tokio::test]
async fn files_are_checked_listed_and_deleted() {
    let base = start_with(Setup::Default, |config| {
        // Above the tests' 64 KiB body limit: uploads have their own.
        config.batch.max_file_bytes = 100_000;
        config.batch.max_requests = 3;
    });
    let good = request_line("a", chat_body("Hi", 4));
    let error_of = |(status, body): (u16, Value)| {
        (status, body["error"]["message"].as_str().unwrap_or_default().to_string())
    };

    let (status, message) =
        error_of(upload(&base, "batch", &jsonl(&[good.clone(), "{oops".into()])).await);
    assert_eq!(status, 400);
    assert!(message.starts_with("line 2 of the file: not a batch request"), "{message}");
    let embeddings = good.replace("/v1/chat/completions", "/v1/embeddings");
    let (status, message) =
        error_of(upload(&base, "batch", &jsonl(&[good.clone(), embeddings])).await);
    assert!(
        status == 400
            && message.starts_with("line 2 of the file: url must be /v1/chat/completions"),
        "{message}"
    );
    let four: Vec<String> =
        (0..4).map(|i| request_line(&format!("r{i}"), chat_body("Hi", 4))).collect();
    let (status, message) = error_of(upload(&base, "batch", &jsonl(&four)).await);
    assert!(status == 400 && message.contains("more than 3 requests"), "{message}");
    let (status, message) = error_of(upload(&base, "batch", &vec![b' '; 100_001]).await);
    assert!(status == 413 && message.contains("larger than 100000 bytes"), "{status} {message}");
    let long = request_line("long", chat_body(&"word ".repeat(16_000), 4));
    let (status, file) = upload(&base, "batch", &jsonl(&[long])).await;
    assert!(status == 200 && file["bytes"].as_u64().unwrap() > 80_000, "{file}");
    client()
        .delete(format!("{base}/v1/files/{}", file["id"].as_str().unwrap()))
        .send()
        .await
        .unwrap();
    let (status, body) = upload(&base, "fine-tune", &jsonl(std::slice::from_ref(&good))).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("purpose")));

    let (status, file) = upload(&base, "batch", &jsonl(&[good])).await;
    assert_eq!(status, 200, "{file}");
    let id = file["id"].as_str().unwrap();
    let (_, list) = get(&base, "/v1/files").await;
    assert_eq!(list["object"], "list");
    assert_eq!(
        list["data"].as_array().unwrap().iter().map(|f| &f["id"]).collect::<Vec<_>>(),
        [&file["id"]],
        "failed uploads are not kept"
    );
    assert_eq!(get(&base, &format!("/v1/files/{id}")).await.1, file);

    let bad_batch = |field: &str, value: &str| {
        let mut body = json!({"input_file_id": id, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
        body[field] = json!(value);
        body
    };
    let (status, body) = post(&base, "/v1/batches", &bad_batch("endpoint", "/v1/embeddings")).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("endpoint")));
    let (status, body) = post(&base, "/v1/batches", &bad_batch("completion_window", "1h")).await;
    assert_eq!((status, body["error"]["param"].as_str()), (400, Some("completion_window")));
    let (status, body) =
        post(&base, "/v1/batches", &bad_batch("input_file_id", "file-missing")).await;
    assert_eq!((status, body["error"]["type"].as_str()), (404, Some("not_found_error")));
    assert_eq!(get(&base, "/v1/batches/batch_missing").await.0, 404);
    assert_eq!(post(&base, "/v1/batches/batch_missing/cancel", &json!({})).await.0, 404);

    let response = client().delete(format!("{base}/v1/files/{id}")).send().await.unwrap();
    assert_eq!(
        response.json::<Value>().await.unwrap(),
        json!({"object": "file", "id": id, "deleted": true})
    );
    assert_eq!(get(&base, &format!("/v1/files/{id}")).await.0, 404);
    assert_eq!(
        client().get(format!("{base}/v1/files/{id}/content")).send().await.unwrap().status(),
        404
    );
    assert_eq!(
        client().delete(format!("{base}/v1/files/{id}")).send().await.unwrap().status(),
        404
    );
}

#[tokio::test]
async fn batches_are_listed_newest_first_and_cancel() {
    let base = start_with(Setup::Default, |_| {});
    // Long answers, so the first batch is still running when it is cancelled.
    let lines: Vec<String> = (0..3)
        .map(|i| request_line(&format!("c{i}"), chat_body("Count from 1 to 1000.", 400)))
        .collect();
    let (_, file) = upload(&base, "batch", &jsonl(&lines)).await;
    let file_id = file["id"].as_str().unwrap();
    let running = create_batch(&base, file_id).await;
    let queued = create_batch(&base, file_id).await;
    let (_, page) = get(&base, "/v1/batches?limit=1").await;
    assert_eq!(
        (page["data"][0]["id"].clone(), page["has_more"].clone()),
        (queued["id"].clone(), json!(true))
    );
    let (_, next) =
        get(&base, &format!("/v1/batches?limit=1&after={}", page["last_id"].as_str().unwrap()))
            .await;
    assert_eq!(next["data"][0]["id"], running["id"]);
    assert_eq!(get(&base, "/v1/batches?limit=0").await.0, 400);

    // The second has not started: cancelled at once, with nothing to show.
    let (status, cancelled) =
        post(&base, &format!("/v1/batches/{}/cancel", queued["id"].as_str().unwrap()), &json!({}))
            .await;
    assert_eq!((status, cancelled["status"].as_str()), (200, Some("cancelled")), "{cancelled}");
    let running_id = running["id"].as_str().unwrap();
    wait_for(&base, running_id, "in_progress").await;
    let (status, cancelling) =
        post(&base, &format!("/v1/batches/{running_id}/cancel"), &json!({})).await;
    assert!(
        status == 200
            && ["cancelling", "cancelled"].contains(&cancelling["status"].as_str().unwrap()),
        "{cancelling}"
    );
    let done = wait_for(&base, running_id, "cancelled").await;
    assert!(done["cancelled_at"].is_u64() && done["cancelling_at"].is_u64(), "{done}");
    let counts = &done["request_counts"];
    assert!(counts["completed"].as_u64().unwrap() < 3, "{done}");
    let (status, body) = post(&base, &format!("/v1/batches/{running_id}/cancel"), &json!({})).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (200, Some("cancelled")),
        "cancelling twice changes nothing"
    );
}

/// What a server left behind when it stopped mid-batch: an input of three requests, one
/// answered (with a marker no model would write) and one torn half-written line after it.
fn half_done_batch(dir: &Path) -> (String, String) {
    let (file_id, batch_id) = ("file-00000000000000010000abcd", "batch_00000000000000020000abcd");
    std::fs::create_dir_all(dir.join("files")).unwrap();
    std::fs::create_dir_all(dir.join("batches")).unwrap();
    let lines: Vec<String> =
        ["a", "b", "c"].iter().map(|id| request_line(id, chat_body("Say hi.", 6))).collect();
    let input = jsonl(&lines);
    let file = json!({"object": "file", "id": file_id, "bytes": input.len(), "created_at": 1, "filename": "in.jsonl", "purpose": "batch", "status": "processed"});
    std::fs::write(dir.join(format!("files/{file_id}.jsonl")), &input).unwrap();
    std::fs::write(dir.join(format!("files/{file_id}.json")), file.to_string()).unwrap();
    let batch = json!({
        "object": "batch", "id": batch_id, "endpoint": "/v1/chat/completions", "errors": null,
        "input_file_id": file_id, "completion_window": "24h", "status": "in_progress",
        "output_file_id": null, "error_file_id": null, "created_at": 1, "in_progress_at": 2,
        "expires_at": null, "finalizing_at": null, "completed_at": null, "failed_at": null,
        "expired_at": null, "cancelling_at": null, "cancelled_at": null,
        "request_counts": {"total": 3, "completed": 1, "failed": 0}, "metadata": null,
    });
    std::fs::write(dir.join(format!("batches/{batch_id}.json")), batch.to_string()).unwrap();
    let answered = json!({"id": "batch_req_1", "custom_id": "a", "response": {"status_code": 200, "request_id": "chatcmpl-1",
        "body": {"object": "chat.completion", "marker": "answered before the restart"}}, "error": null});
    std::fs::write(
        dir.join(format!("batches/{batch_id}.output")),
        format!("{answered}\n{{\"id\": \"batch_req_2\", \"cust"),
    )
    .unwrap();
    (file_id.into(), batch_id.into())
}

#[tokio::test]
async fn a_restarted_server_finishes_a_batch_without_redoing_answered_requests() {
    let dir: PathBuf = fresh_dir("resume");
    let (_, batch_id) = half_done_batch(&dir);
    let base = start_with(Setup::Default, |config| config.batch.dir = dir.clone());
    let done = wait_for(&base, &batch_id, "completed").await;
    assert_eq!(done["request_counts"], json!({"total": 3, "completed": 3, "failed": 0}));
    let output = content(&base, done["output_file_id"].as_str().unwrap()).await;
    assert_eq!(custom_ids(&output), ["a", "b", "c"]);
    let a = output.iter().find(|l| l["custom_id"] == "a").unwrap();
    assert_eq!(
        a["response"]["body"]["marker"], "answered before the restart",
        "request a was run again"
    );
    assert!(done["error_file_id"].is_null(), "{done}");
}

#[tokio::test]
async fn a_server_stopped_mid_batch_leaves_it_to_the_next_one() {
    let dir = fresh_dir("restart");
    // Each request runs to its token limit (the schema needs more characters than that): the
    // first after 8 tokens, the other four, which name none, when the context is full. The
    // first server's context leaves each of them ~8,000 steps, so the stop that follows a poll
    // of the first answer comes long before the batch could be done, however loaded the
    // machine (with 200 tokens each, a stalled test thread once saw all five answered and the
    // batch closed); the second server's leaves ~230, to finish the batch soon.
    let first = start_stoppable(Setup::Default, |config| {
        (config.batch.dir, config.ctx_size) = (dir.clone(), 8192)
    });
    let lines: Vec<String> = (0..5)
        .map(|i| {
            let mut body = chat_body(&format!("Count from {i} to 1000."), 8);
            if i > 0 {
                body.as_object_mut().unwrap().remove("max_tokens");
            }
            body["response_format"] = unclosable_schema();
            request_line(&format!("r{i}"), body)
        })
        .collect();
    let (_, file) = upload(&first.url, "batch", &jsonl(&lines)).await;
    let batch = create_batch(&first.url, file["id"].as_str().unwrap()).await;
    let id = batch["id"].as_str().unwrap().to_string();
    loop {
        let (_, batch) = get(&first.url, &format!("/v1/batches/{id}")).await;
        if batch["request_counts"]["completed"].as_u64().unwrap() >= 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    first.stop();
    // What the first server answered, as it left it on disk.
    let log = std::fs::read_to_string(dir.join(format!("batches/{id}.output"))).unwrap();
    let before: Vec<Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!((1..5).contains(&before.len()), "stopped after {} of 5 answers", before.len());

    let second = start_with(Setup::Default, |config| {
        (config.batch.dir, config.ctx_size) = (dir.clone(), 256)
    });
    let done = wait_for(&second, &id, "completed").await;
    assert_eq!(done["request_counts"], json!({"total": 5, "completed": 5, "failed": 0}));
    let output = content(&second, done["output_file_id"].as_str().unwrap()).await;
    assert_eq!(custom_ids(&output), ["r0", "r1", "r2", "r3", "r4"]);
    for answered in &before {
        assert!(output.contains(answered), "{} was answered again", answered["custom_id"]);
    }
}

/// A response format needing 3,000 characters: an answer to it ends at its token limit.
fn unclosable_schema() -> Value {
    let schema = json!({"type": "object", "properties": {"numbers": {"type": "string", "minLength": 3000}}, "required": ["numbers"]});
    json!({"type": "json_schema", "json_schema": {"name": "long", "schema": schema}})
}

/// The number a Prometheus gauge shows on `/metrics` (its one model's series).
async fn gauge(base: &str, name: &str) -> f64 {
    let text = client().get(format!("{base}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

#[tokio::test]
async fn a_live_request_goes_before_the_batch_request_in_flight() {
    // One slot and no queue: a live request that had to wait for batch work would be refused.
    let base =
        start_with(Setup::Default, |config| (config.max_concurrent, config.max_queue) = (1, 0));
    // The batch request cannot end early.
    let mut long = chat_body("Count from 1 to 1000.", 1500);
    long["response_format"] = unclosable_schema();
    let lines: Vec<String> = (0..2).map(|i| request_line(&format!("n{i}"), long.clone())).collect();
    let (_, file) = upload(&base, "batch", &jsonl(&lines)).await;
    let batch = create_batch(&base, file["id"].as_str().unwrap()).await;
    let id = batch["id"].as_str().unwrap();
    wait_for(&base, id, "in_progress").await;
    while gauge(&base, "vllm:num_requests_running").await < 1.0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, live) =
        post(&base, "/v1/chat/completions", &chat_body("What is the capital of France?", 8)).await;
    assert_eq!(status, 200, "{live}");
    // The first batch request needs 3,000 characters; the live one did not wait for them.
    let (_, during) = get(&base, &format!("/v1/batches/{id}")).await;
    assert_eq!(
        (during["status"].as_str(), &during["request_counts"]["completed"]),
        (Some("in_progress"), &json!(0)),
        "{during}"
    );
    post(&base, &format!("/v1/batches/{id}/cancel"), &json!({})).await;
    wait_for(&base, id, "cancelled").await;
}

#[test]
fn the_openai_python_client_runs_a_batch() {
    let python = python_with("import openai", "openai>=1.66");
    let base = start_with(Setup::Default, |_| {});
    run_python_script(&python, "openai_batches.py", &[base]);
}
