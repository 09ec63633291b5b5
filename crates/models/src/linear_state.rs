//! One sequence's state in one linear-attention layer: what a Gated DeltaNet layer carries from
//! token to token, and what the prefix cache snapshots and a speculative round rolls back.

#[derive(Clone, Debug, PartialEq)]
pub struct LinearAttentionState {
    /// The last `conv_kernel - 1` convolution inputs, oldest first, `conv_channels` each.
    pub conv: Vec<f32>,
    /// The delta rule's `k_dim × v_dim` matrix per value head.
    pub recurrent: Vec<f32>,
}
