//! The one request pipeline every protocol runs through. A protocol's adapter converts its wire
//! request into a [`GenerationRequest`](request::GenerationRequest); [`start_on`] renders and
//! tokenizes its prompt on the model leased for it, plans the answer's shape and the engine
//! request, admits it and submits it; the adapter reads the [`Generation`]'s outputs (the one
//! event stream) and answers them in its own wire events through
//! [`respond_on_model`](respond::respond_on_model).

pub(crate) mod generation;
mod plan;
pub(crate) mod render;
pub(crate) mod request;
pub(crate) mod respond;
mod shape;
pub(crate) mod tool_calls;

use std::sync::Arc;

use spindle_api::ApiError;

use crate::admission::Admission;
use crate::error::failure;
use crate::loaded_model::ModelLease;
use crate::state::AppState;
use generation::Generation;
use request::{GenerationRequest, Prompt};
use tool_calls::ToolCallStage;

/// A request handed to the engine: what every protocol adapter reads its answer from.
pub(crate) struct Started {
    pub generation: Generation,
    /// The tool-call parser, when the request offers tools (and its tool choice is not `none`).
    pub tools: Option<ToolCallStage>,
    /// Tokens in the prompt (known before any is read).
    pub prompt_tokens: usize,
}

/// Renders and tokenizes `request`'s prompt (validated) on `model`, resolves its answer's shape
/// and submits it as request `id` (the response's id), live or as a batch's.
pub(crate) fn start_on(
    state: &Arc<AppState>,
    model: ModelLease,
    request: &GenerationRequest,
    id: &str,
    admission: Admission,
) -> Result<Started, ApiError> {
    let shape = match &request.prompt {
        Prompt::Chat(conversation) => Some(shape::answer_shape(state, &model, conversation)?),
        Prompt::Tokens(_) => None,
    };
    let (constraint, tool_calls) = shape.map_or((None, None), |s| (s.constraint, s.tool_calls));
    let plan = plan::plan(state, &model, request, constraint)?;
    let prompt_tokens = plan.prompt_ids.len();
    let tools = tool_calls.as_ref().map(|parsing| ToolCallStage::new(parsing, id));
    let generation = Generation::start(state, model, id, request.endpoint, plan, admission)?;
    Ok(Started { generation, tools, prompt_tokens })
}

/// The prompt's token ids, rendered and tokenized as [`start_on`] would, without generating,
/// and the name of the model that read them.
pub(crate) async fn prompt_token_ids(
    state: &AppState,
    request: &GenerationRequest,
) -> Result<(String, Vec<u32>), ApiError> {
    request.validate()?;
    let model = state.model(request.model.as_deref(), request.ttl).await?;
    let ids = match &request.prompt {
        Prompt::Tokens(ids) => ids.clone(),
        Prompt::Chat(conversation) => {
            let text = render::render_prompt(
                state,
                &model,
                &conversation.messages,
                &conversation.tools,
                &conversation.template_kwargs,
            )?
            .text;
            model.model.tokenizer.encode(&text, false).map_err(failure)?
        }
    };
    Ok((model.id.clone(), ids))
}
