//! Going back inside a speculative round on recurrent layers. A round runs the decided token and
//! its drafts in one pass and keeps only the positions up to the first rejected draft; a
//! linear-attention layer has folded every position into its state by then. So while a pass
//! verifies drafts, each such layer keeps, per position, the delta rule's matrices after it (in
//! slots reused round after round, as llama.cpp keeps a per-token snapshot of each DeltaNet
//! layer) and the convolution inputs the pass read, whose rows are the window after any of its
//! positions. Going back to position `i` of the pass swaps slot `i` in as the state and copies
//! the window's few rows: nothing is recomputed, and no whole state is copied to save or
//! restore one.

use std::ops::Range;

use crate::linear_state::LinearAttentionState;

/// What one linear-attention layer keeps of the latest verification pass.
#[derive(Debug, Default)]
pub struct PositionHistory {
    /// `states[i]`: the delta rule's matrices after the pass's position `i`, for every position
    /// but the last (the layer's own state is that one). Slots beyond the pass are spare.
    states: Vec<Vec<f32>>,
    /// The convolution window before the pass, then each position's inputs, a row each.
    conv_inputs: Vec<f32>,
    /// Width of a row of `conv_inputs`.
    conv_channels: usize,
}

impl PositionHistory {
    /// Slots for the states after the first `positions` positions of a pass, each
    /// `state_len` long, allocated on the first pass that needs them and reused after.
    pub fn state_slots(&mut self, positions: usize, state_len: usize) -> &mut [Vec<f32>] {
        if self.states.len() < positions {
            self.states.resize_with(positions, || vec![0.0; state_len]);
        }
        &mut self.states[..positions]
    }

    /// Keeps the convolution's inputs over the pass (the window before it, then one row of
    /// `channels` per position).
    pub fn keep_conv_inputs(&mut self, inputs: Vec<f32>, channels: usize) {
        self.conv_inputs = inputs;
        self.conv_channels = channels;
    }

    /// Whether this holds what [`restore`](Self::restore) needs to bring `state` back to
    /// position `position` of the pass.
    fn holds(&self, position: usize, state: &LinearAttentionState) -> bool {
        let window_end = (position + 1) * self.conv_channels + state.conv.len();
        self.states.get(position).is_some_and(|kept| kept.len() == state.recurrent.len())
            && window_end <= self.conv_inputs.len()
    }

    /// Makes `state` the layer's state after position `position` of the pass (not its last).
    fn restore(&mut self, position: usize, state: &mut LinearAttentionState) {
        std::mem::swap(&mut state.recurrent, &mut self.states[position]);
        let window_start = (position + 1) * self.conv_channels;
        let window = &self.conv_inputs[window_start..][..state.conv.len()];
        state.conv.copy_from_slice(window);
    }
}

/// Per sequence: where the latest pass that verified drafts ran, and what each recurrent layer
/// kept of it.
#[derive(Debug)]
pub struct Rollback {
    /// Per layer, parallel to the recurrent state: `Some` for linear-attention layers.
    layers: Vec<Option<PositionHistory>>,
    /// The positions of that pass, while they are the cache's last ones (any other pass, or a
    /// truncation before them, ends it).
    window: Option<Range<usize>>,
}

impl Rollback {
    /// Nothing kept yet, for a model whose layers are recurrent where `recurrent[layer]` is.
    pub fn new<T>(recurrent: &[Option<T>]) -> Self {
        let layers = recurrent.iter().map(|s| s.as_ref().map(|_| PositionHistory::default()));
        Self { layers: layers.collect(), window: None }
    }

    /// Where layer `layer` keeps the states of a verification pass.
    pub fn layer(&mut self, layer: usize) -> Option<&mut PositionHistory> {
        self.layers.get_mut(layer)?.as_mut()
    }

    /// Positions `positions` ran in a pass that verified drafts: each may become the last.
    pub fn verified(&mut self, positions: Range<usize>) {
        self.window = Some(positions);
    }

    /// Positions ran in a pass that kept nothing.
    pub fn close(&mut self) {
        self.window = None;
    }

    /// Brings `states` back to where they were after position `len - 1`, a position of the
    /// latest verification pass (whose end is the cache's end); false, changing nothing, when
    /// `len` is not such a position.
    pub fn go_back(&mut self, len: usize, states: &mut [Option<LinearAttentionState>]) -> bool {
        let Some(position) = self.position_of(len) else { return false };
        if !self.holds(position, states) {
            return false;
        }
        self.restore(position, states);
        self.went_back(len);
        true
    }

    /// Whether every layer of `states` (the first layers, or all) kept what bringing it back
    /// to position `position` of the latest verification pass takes.
    pub fn holds(&self, position: usize, states: &[Option<LinearAttentionState>]) -> bool {
        self.layers.iter().zip(states).all(|pair| match pair {
            (Some(history), Some(state)) => history.holds(position, state),
            (None, None) => true,
            _ => false,
        })
    }

    /// Brings every layer of `states` back to position `position`, which
    /// [`holds`](Self::holds) found kept.
    pub fn restore(&mut self, position: usize, states: &mut [Option<LinearAttentionState>]) {
        for (history, state) in self.layers.iter_mut().zip(states.iter_mut()) {
            if let (Some(history), Some(state)) = (history, state) {
                history.restore(position, state);
            }
        }
    }

    /// Where position `len - 1` lies in the latest verification pass (0: its first), when it
    /// is one of its positions but the last.
    pub fn position_of(&self, len: usize) -> Option<usize> {
        let window = self.window.as_ref()?;
        (len > window.start && len < window.end).then(|| len - window.start - 1)
    }

    /// The states went back to after position `len - 1` (elsewhere, on a device).
    pub fn went_back(&mut self, len: usize) {
        // The positions before still hold their states: going back further works.
        if let Some(window) = &mut self.window {
            window.end = len;
        }
    }
}
