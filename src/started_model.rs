//! The model a server started by `spindle bench <panel>` or `spindle eval` serves, on disk
//! before the server starts ([`spindle_bench::cli::ModelResolver`]).

use spindle_models::random_hybrid::HybridShape;

/// `model` (None: the catalogue's default) pulled into the cache, or with `hybrid` the agent
/// benchmark's random-weight Qwen3.5-MoE written once; what `spindle serve --model` takes.
pub fn resolve(model: Option<&str>, hybrid: bool) -> anyhow::Result<String> {
    if hybrid {
        return Ok(crate::random_hybrid::shape_path(&HybridShape::AGENT_BAR, 2)?
            .display()
            .to_string());
    }
    let model = model.unwrap_or(spindle_hub::DEFAULT_MODEL);
    spindle_hub::resolve(model, &spindle_hub::spindle_home(), spindle_hub::WhenMissing::Download)?;
    Ok(model.to_string())
}
