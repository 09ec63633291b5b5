//! Tokens without generating: `tokenize` and `detokenize` (at `/v1/…` and at the root, where vLLM
//! and llama-server serve them), and vLLM's render endpoints, which give the token ids a chat or
//! completion request would start from. Routers read these to place a request on the replica
//! that caches its prefix: vllm-router's `cache_aware` policy renders every chat request first,
//! and llm-d's token producer does the same before matching KV-cache events.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::Json;
use spindle_api::{
    ApiError, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, DetokenizeResponse,
    RenderedPrompt, TokenizeRequest, TokenizeResponse,
};

use crate::answer_parts::ResponseHead;
use crate::chat::request::generation_request;
use crate::completions::prompt_ids;
use crate::error::{failure, parse_json, HttpError};
use crate::pipeline::prompt_token_ids;
use crate::pipeline::render::render_prompt;
use crate::state::AppState;

pub(crate) async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<TokenizeResponse>, HttpError> {
    let request: TokenizeRequest = parse_json(&body?)?;
    request.validate()?;
    let model = state.model(request.model.as_deref(), None).await?;
    let tokenizer = &model.model.tokenizer;
    let tokens = if let Some(messages) = &request.messages {
        let prompt = render_prompt(&state, &model, messages, &[], &Default::default())?.text;
        // The template already wrote the special tokens it wants.
        tokenizer.encode(&prompt, request.add_special_tokens.unwrap_or(false))
    } else {
        tokenizer.encode(
            request.prompt.as_deref().unwrap_or_default(),
            request.add_special_tokens.unwrap_or(true),
        )
    }
    .map_err(failure)?;
    Ok(Json(TokenizeResponse { count: tokens.len(), tokens, max_model_len: model.ctx_size }))
}

pub(crate) async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<DetokenizeResponse>, HttpError> {
    let request: DetokenizeRequest = parse_json(&body?)?;
    let model = state.model(request.model.as_deref(), None).await?;
    let tokenizer = &model.model.tokenizer;
    if let Some(bad) = request.tokens.iter().find(|&&id| id as usize >= tokenizer.vocab_size()) {
        return Err(ApiError::bad_request(
            format!("token id {bad} is outside the vocabulary"),
            Some("tokens"),
        )
        .into());
    }
    let prompt = tokenizer.decode(&request.tokens, false).map_err(failure)?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// `POST /v1/chat/completions/render`: the chat request is read and checked as
/// `/v1/chat/completions` reads it (tools, template arguments, reasoning switches included),
/// so the ids are the ones its generation would start from.
pub(crate) async fn render_chat(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<RenderedPrompt>, HttpError> {
    let request: ChatCompletionRequest = parse_json(&body?)?;
    request.validate()?;
    let (model, token_ids) = prompt_token_ids(&state, &generation_request(&request)?).await?;
    Ok(Json(RenderedPrompt { request_id: ResponseHead::fresh_id("chatcmpl"), model, token_ids }))
}

/// `POST /v1/completions/render`: a list, as vLLM answers it, of the one prompt's ids.
pub(crate) async fn render_completion(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Vec<RenderedPrompt>>, HttpError> {
    let request: CompletionRequest = parse_json(&body?)?;
    request.validate()?;
    let model = state.model(request.model.as_deref(), request.ttl).await?;
    let token_ids = prompt_ids(&model.model.tokenizer, &request.prompt)?;
    let request_id = ResponseHead::fresh_id("cmpl");
    Ok(Json(vec![RenderedPrompt { request_id, model: model.id.clone(), token_ids }]))
}
