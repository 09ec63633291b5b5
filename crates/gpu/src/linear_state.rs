//! What Gated DeltaNet layers keep per sequence on the device, and which rows of a step each
//! sequence owns: the convolution windows and the delta rule's matrices of many sequences sit
//! in slots of one buffer each, so one dispatch runs a whole batch, each sequence reading and
//! moving on its own slot. A sequence whose rows verify drafts also leaves its state after each
//! of them (its last but one included) in rows of a history buffer, so that its slot can go
//! back to any of them on the device.

use crate::buffer::{GpuBytes, GpuTensor};
use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::kernel::count;
use crate::step::Step;

/// Widest key head the delta rule holds (each lane keeps one column of a head's matrix).
pub const MAX_K_DIM: usize = 256;

/// The heads of one linear-attention layer (as `spindle_models`' `DeltaHeads`, with the
/// convolution's width).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub k_dim: usize,
    pub v_dim: usize,
    /// Value head `j` reads key head `j mod k_heads` (llama.cpp's GGUFs) rather than
    /// `j / (v_heads / k_heads)` (HF checkpoints).
    pub tiled: bool,
    /// Positions the causal convolution reads, the token's own included.
    pub conv_kernel: usize,
}

impl DeltaNetShape {
    /// A hybrid model's DeltaNet layers, as the device kernels take them.
    pub(crate) fn of(cfg: &spindle_models::HybridConfig) -> Self {
        let h = cfg.delta_net_shape();
        DeltaNetShape {
            k_heads: h.heads.k_heads,
            v_heads: h.heads.v_heads,
            k_dim: h.heads.k_dim,
            v_dim: h.heads.v_dim,
            tiled: h.heads.tiled,
            conv_kernel: h.conv_kernel,
        }
    }

    pub fn key_dim(&self) -> usize {
        self.k_heads * self.k_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.v_dim
    }

    /// Channels through the convolution: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Values of one sequence's convolution window: its last `conv_kernel - 1` inputs.
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_channels()
    }

    /// Values one sequence keeps in a layer: its convolution window and its matrices.
    pub fn state_len(&self) -> usize {
        self.conv_state_len() + self.recurrent_state_len()
    }

    /// Values of one sequence's delta-rule matrices, `k_dim × v_dim` per value head.
    pub fn recurrent_state_len(&self) -> usize {
        self.v_heads * self.k_dim * self.v_dim
    }

    pub(crate) fn check(&self) -> Result<()> {
        let &DeltaNetShape { k_heads, v_heads, k_dim, v_dim, conv_kernel, .. } = self;
        if k_heads == 0
            || v_dim == 0
            || k_dim == 0
            || k_dim > MAX_K_DIM
            || conv_kernel == 0
            || !v_heads.is_multiple_of(k_heads)
            || v_heads == 0
        {
            return Err(GpuError::BadInput(format!(
                "{v_heads} value heads of {v_dim} over {k_heads} key heads of {k_dim} (at most \
                 {MAX_K_DIM}; value heads a multiple of key heads), convolution of {conv_kernel}"
            )));
        }
        Ok(())
    }
}

/// One layer's states of `slots` sequences: `conv` is `slots × (conv_kernel − 1) × channels`
/// (oldest input first, as the CPU's `LinearAttentionState::conv`), `recurrent` is
/// `slots × v_heads × k_dim × v_dim` (as its `recurrent`). `conv_history` and
/// `recurrent_history` hold `history_rows` more states laid out alike, written by runs that
/// keep their positions' states ([`LinearRun::history`]).
pub struct LinearStates {
    pub conv: GpuTensor,
    pub recurrent: GpuTensor,
    pub conv_history: GpuTensor,
    pub recurrent_history: GpuTensor,
    shape: DeltaNetShape,
    slots: usize,
    history_rows: usize,
}

impl LinearStates {
    /// `slots` states before any token: empty windows, zero matrices.
    pub fn zeros(gpu: &Gpu, shape: DeltaNetShape, slots: usize) -> Result<Self> {
        shape.check()?;
        let conv = vec![0.0; slots * shape.conv_state_len()];
        let recurrent = vec![0.0; slots * shape.recurrent_state_len()];
        Self::upload(gpu, shape, &conv, &recurrent)
    }

    /// States from the host, slot after slot.
    pub fn upload(
        gpu: &Gpu,
        shape: DeltaNetShape,
        conv: &[f32],
        recurrent: &[f32],
    ) -> Result<Self> {
        shape.check()?;
        let slots = recurrent.len() / shape.recurrent_state_len();
        if slots == 0
            || recurrent.len() != slots * shape.recurrent_state_len()
            || conv.len() != slots * shape.conv_state_len()
        {
            return Err(GpuError::BadInput(format!(
                "windows of {} and matrices of {} values are no whole number of states of \
                 {} and {}",
                conv.len(),
                recurrent.len(),
                shape.conv_state_len(),
                shape.recurrent_state_len()
            )));
        }
        Ok(LinearStates {
            conv: gpu.upload(conv)?,
            recurrent: gpu.upload(recurrent)?,
            // A binding needs a buffer: one value until a run keeps its states.
            conv_history: gpu.upload(&[0.0])?,
            recurrent_history: gpu.upload(&[0.0])?,
            shape,
            slots,
            history_rows: 0,
        })
    }

    /// Room for at least `rows` states of runs that keep them; growing forgets what the rows
    /// held (a pass's states matter only until the next pass).
    pub fn keep_history(&mut self, gpu: &Gpu, rows: usize) -> Result<()> {
        if rows > self.history_rows {
            self.conv_history = gpu.upload(&vec![0.0; rows * self.shape.conv_state_len()])?;
            self.recurrent_history =
                gpu.upload(&vec![0.0; rows * self.shape.recurrent_state_len()])?;
            self.history_rows = rows;
        }
        Ok(())
    }

    /// Puts history row `row` in slot `slot`: the state the slot's sequence had after that
    /// row's position.
    pub fn restore(&self, step: &mut Step<'_>, row: usize, slot: usize) -> Result<()> {
        if row >= self.history_rows || slot >= self.slots {
            return Err(GpuError::BadInput(format!(
                "history row {row} of {} into slot {slot} of {}",
                self.history_rows, self.slots
            )));
        }
        let (conv, matrices) = (self.shape.conv_state_len(), self.shape.recurrent_state_len());
        step.copy(&self.conv_history, row * conv, &self.conv, slot * conv, conv)?;
        step.copy(
            &self.recurrent_history,
            row * matrices,
            &self.recurrent,
            slot * matrices,
            matrices,
        )
    }

    pub fn shape(&self) -> DeltaNetShape {
        self.shape
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn history_rows(&self) -> usize {
        self.history_rows
    }
}

/// One sequence's part of a step: rows `first_row..first_row + rows` of the step's tensors,
/// continuing from state slot `slot`.
#[derive(Clone, Copy, Debug)]
pub struct LinearRun {
    pub first_row: usize,
    pub rows: usize,
    pub slot: usize,
    /// `Some(h)`: the state after each of the run's positions but the last goes to history
    /// rows `h..h + rows − 1` (a pass that verifies drafts).
    pub history: Option<usize>,
}

/// A run's history word on the device: none.
const NO_HISTORY: u32 = u32::MAX;

/// A step's sequences, on the device as `(first_row, rows, slot, history row or u32::MAX)`.
pub struct LinearRuns {
    runs: Vec<LinearRun>,
    pub(crate) on_device: GpuBytes,
}

impl LinearRuns {
    /// Fails when two sequences name one slot: both would move it on at once.
    pub fn upload(gpu: &Gpu, runs: Vec<LinearRun>) -> Result<Self> {
        let mut slots: Vec<usize> = runs.iter().map(|r| r.slot).collect();
        slots.sort_unstable();
        if runs.is_empty() || slots.windows(2).any(|w| w[0] == w[1]) {
            return Err(GpuError::BadInput(format!(
                "{} sequences, with slots {slots:?}: each needs a slot of its own",
                runs.len()
            )));
        }
        let mut words = Vec::with_capacity(4 * runs.len());
        for r in &runs {
            let history = r.history.map_or(Ok(NO_HISTORY), |h| count(h, "history row"))?;
            words.extend([
                count(r.first_row, "first row")?,
                count(r.rows, "rows")?,
                count(r.slot, "slot")?,
                history,
            ]);
        }
        let on_device = gpu.upload_indices(&words, "linear runs")?;
        Ok(LinearRuns { runs, on_device })
    }

    pub fn len(&self) -> usize {
        self.runs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// Checks that every sequence's rows lie in a step of `tokens` rows, its slot in `states`
    /// and the states it keeps in their history.
    pub(crate) fn check(&self, tokens: usize, states: &LinearStates) -> Result<()> {
        let outside = |r: &&LinearRun| {
            let kept_past =
                r.history.is_some_and(|h| h + r.rows.saturating_sub(1) > states.history_rows);
            r.first_row + r.rows > tokens || r.slot >= states.slots || kept_past
        };
        match self.runs.iter().find(outside) {
            Some(r) => Err(GpuError::BadInput(format!(
                "a sequence of rows {}..{} in slot {} (history from {:?}) of a step of {tokens} \
                 rows, {} slots and {} history rows",
                r.first_row,
                r.first_row + r.rows,
                r.slot,
                r.history,
                states.slots,
                states.history_rows
            ))),
            None => Ok(()),
        }
    }
}
