//! A step's linear-attention states on the device. The caller's caches stay the truth (their
//! snapshots, the prefix cache and preemption keep working unchanged): each entry's state goes
//! up into a slot of its own at the step's start, and comes back with the logits, in the same
//! submission, into its cache.

use spindle_models::{BatchEntry, RowRange};

use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::linear_state::{DeltaNetShape, LinearRun, LinearRuns, LinearStates};
use crate::loading::model_error;
use crate::step::{Readback, Step};

pub(crate) struct StepStates {
    /// One per linear-attention layer, in layer order; slot `s` is entry `s`'s.
    pub(crate) layers: Vec<LinearStates>,
    pub(crate) runs: LinearRuns,
    shape: DeltaNetShape,
}

/// The states as they are after a step, to be read once it has run.
pub(crate) struct ReadStates {
    layers: Vec<(Readback, Readback)>,
    shape: DeltaNetShape,
}

impl StepStates {
    /// Every entry's states out of its cache (`rows`: its rows of the step), for `layers`
    /// linear-attention layers of `shape`. A cache whose state has another shape (another
    /// model's) is refused.
    pub(crate) fn upload(
        gpu: &Gpu,
        shape: DeltaNetShape,
        layers: usize,
        batch: &[BatchEntry<'_>],
        rows: &[RowRange],
    ) -> Result<Self> {
        let (conv_len, matrices_len) = (shape.conv_state_len(), shape.recurrent_state_len());
        let per_layer = conv_len + matrices_len;
        let floats: Vec<Vec<f32>> = batch.iter().map(|e| e.cache.recurrent().to_floats()).collect();
        if let Some(f) = floats.iter().find(|f| f.len() != layers * per_layer) {
            return Err(GpuError::BadInput(format!(
                "a cache with a recurrent state of {} numbers for a model whose {layers} \
                 linear-attention layers hold {per_layer} each",
                f.len()
            )));
        }
        let layers = (0..layers)
            .map(|l| {
                let part = |from: usize, len: usize| -> Vec<f32> {
                    floats.iter().flat_map(|f| &f[l * per_layer + from..][..len]).copied().collect()
                };
                LinearStates::upload(gpu, shape, &part(0, conv_len), &part(conv_len, matrices_len))
            })
            .collect::<Result<_>>()?;
        let runs = rows
            .iter()
            .enumerate()
            .map(|(slot, &(first_row, rows))| LinearRun { first_row, rows, slot })
            .collect();
        Ok(StepStates { layers, runs: LinearRuns::upload(gpu, runs)?, shape })
    }

    /// Reads the states as they are at this point of the step.
    pub(crate) fn read(&self, step: &mut Step<'_>) -> ReadStates {
        let layers = self.layers.iter().map(|s| (step.read(&s.conv), step.read(&s.recurrent)));
        ReadStates { layers: layers.collect(), shape: self.shape }
    }
}

impl ReadStates {
    /// Hands each entry its states back, once the step has run.
    pub(crate) fn write_back(self, batch: &mut [BatchEntry<'_>]) -> spindle_models::Result<()> {
        let (conv_len, matrices_len) =
            (self.shape.conv_state_len(), self.shape.recurrent_state_len());
        let layers = self
            .layers
            .into_iter()
            .map(|(conv, matrices)| Ok((conv.values()?, matrices.values()?)))
            .collect::<Result<Vec<_>>>()
            .map_err(model_error)?;
        for (slot, entry) in batch.iter_mut().enumerate() {
            let floats: Vec<f32> = layers
                .iter()
                .flat_map(|(conv, matrices)| {
                    let conv = &conv[slot * conv_len..][..conv_len];
                    conv.iter().chain(&matrices[slot * matrices_len..][..matrices_len])
                })
                .copied()
                .collect();
            entry.cache.set_recurrent_floats(&floats)?;
        }
        Ok(())
    }
}
