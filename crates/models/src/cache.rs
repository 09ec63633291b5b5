//! Per-sequence state, owned by the caller and passed into `forward`, so the weights stay
//! immutable and shared between sequences: the block table naming where the sequence's
//! attention keys/values live in a [`PagedKv`], and for linear-attention layers their recurrent
//! state.

use std::sync::{Arc, OnceLock};

use candle_core::{Device, Tensor};

use crate::dense::with_values;
use crate::error::{ModelError, Result};
use crate::gated_deltanet::LinearRun;
use crate::kv_type::KvType;
use crate::linear_state::LinearAttentionState;
use crate::paged_attention::{self, Queries, Visibility};
use crate::paged_kv::{KvShape, PagedKv};
use crate::rollback::Rollback;

/// Positions per block of a cache that owns its storage alone.
const STANDALONE_BLOCK: usize = 64;

/// The recurrent state of every linear-attention layer (`None` for the others). A plain value:
/// a clone is a snapshot the sequence can later resume from, exactly.
#[derive(Clone, Debug, PartialEq)]
pub struct RecurrentState(pub(crate) Vec<Option<LinearAttentionState>>);

impl RecurrentState {
    /// The state of a model without linear-attention layers.
    pub fn none(layers: usize) -> Self {
        Self(vec![None; layers])
    }

    /// True when the model has no recurrent layers (a snapshot is then unnecessary).
    pub fn is_empty(&self) -> bool {
        self.0.iter().all(Option::is_none)
    }

    pub fn bytes(&self) -> usize {
        self.floats_from(0) * std::mem::size_of::<f32>()
    }

    /// How many numbers the layers from `first_layer` on hold.
    fn floats_from(&self, first_layer: usize) -> usize {
        let layers = self.0.iter().skip(first_layer).flatten();
        layers.map(|s| s.conv.len() + s.recurrent.len()).sum()
    }

    /// All numbers, layer after layer (convolution window, then matrices), for the disk tier.
    pub fn to_floats(&self) -> Vec<f32> {
        self.to_floats_from(0)
    }

    /// The numbers of the layers from `first_layer` on, laid out as
    /// [`to_floats`](Self::to_floats) lays out all of them (what a device that holds only those
    /// layers takes).
    pub fn to_floats_from(&self, first_layer: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.floats_from(first_layer));
        for state in self.0.iter().skip(first_layer).flatten() {
            out.extend_from_slice(&state.conv);
            out.extend_from_slice(&state.recurrent);
        }
        out
    }

    /// A state shaped like `self` holding `floats` (as [`to_floats`](Self::to_floats) wrote them).
    pub fn with_floats(&self, floats: &[f32]) -> Result<Self> {
        self.with_floats_from(0, floats)
    }

    /// `self` with the layers from `first_layer` on holding `floats` (as
    /// [`to_floats_from`](Self::to_floats_from) wrote them); the layers before stay as they are.
    pub fn with_floats_from(&self, first_layer: usize, floats: &[f32]) -> Result<Self> {
        if floats.len() != self.floats_from(first_layer) {
            return Err(ModelError::BadConfig(format!(
                "a recurrent state holds {} numbers, got {}",
                self.floats_from(first_layer),
                floats.len()
            )));
        }
        let mut rest = floats;
        let mut take = |n: usize| {
            let (head, tail) = rest.split_at(n);
            rest = tail;
            head.to_vec()
        };
        let layers = self
            .0
            .iter()
            .enumerate()
            .map(|(layer, s)| match s {
                Some(s) if layer >= first_layer => Some(LinearAttentionState {
                    conv: take(s.conv.len()),
                    recurrent: take(s.recurrent.len()),
                }),
                kept => kept.clone(),
            })
            .collect();
        Ok(Self(layers))
    }
}

/// A recurrent state that a model on a device moved on and still holds there: the host reads
/// it back only when it needs it (a snapshot, the disk tier, a pass on the CPU), not after
/// every step.
pub trait DeviceRecurrentState: Send + Sync {
    /// The first layer whose state the device holds: the layers before it keep theirs on the
    /// host, in the cache (a model whose first blocks run on the CPU), and move on there.
    fn first_layer(&self) -> usize;
    /// The numbers of the layers from [`first_layer`](Self::first_layer) on, laid out as
    /// [`RecurrentState::to_floats_from`] writes them.
    fn floats(&self) -> Result<Vec<f32>>;
    /// Brings the state back to where it was after position `position` (counted from 0) of
    /// the latest pass that verified drafts, not its last; false, changing nothing, where the
    /// device no longer keeps that position's state.
    fn go_back(&self, position: usize) -> Result<bool>;
    /// So that the model that made it knows its own.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// The device's state, and the host's copy once read.
struct DeviceHeld {
    state: Arc<dyn DeviceRecurrentState>,
    read: OnceLock<RecurrentState>,
}

/// Everything a sequence has processed: positions `0..len` in the blocks of its block table,
/// and the recurrent state after position `len - 1`.
pub struct SequenceCache {
    kv: Arc<PagedKv>,
    blocks: Vec<u32>,
    /// The state, but for the layers `on_device` holds a later one of (of those only the
    /// shape counts).
    recurrent: RecurrentState,
    on_device: Option<DeviceHeld>,
    /// What the recurrent layers kept of the latest pass that verified drafts.
    rollback: Rollback,
    len: usize,
    limit: usize,
    /// The final hidden states of the latest pass's rows and the position of the first, once
    /// asked for ([`keep_hidden_states`](Self::keep_hidden_states)): a draft head reads them.
    hidden: Option<(usize, Vec<f32>)>,
}

impl SequenceCache {
    /// A cache with storage of its own, as `kind`, for `limit` positions (one sequence run by
    /// itself).
    pub fn standalone(
        shapes: &[Option<KvShape>],
        kind: KvType,
        recurrent: RecurrentState,
        limit: usize,
    ) -> Self {
        let blocks = limit.div_ceil(STANDALONE_BLOCK).max(1);
        let kv = Arc::new(PagedKv::new(shapes, kind, blocks, STANDALONE_BLOCK));
        let rollback = Rollback::new(&recurrent.0);
        let blocks = (0..blocks as u32).collect();
        Self { kv, blocks, recurrent, on_device: None, rollback, len: 0, limit, hidden: None }
    }

    /// A cache that has processed positions `0..len`, whose keys/values are in `blocks` of the
    /// shared storage `kv` and whose recurrent state is `recurrent`. Further blocks are added
    /// with [`add_blocks`](Self::add_blocks) before the positions that need them are run.
    pub fn resume(
        kv: Arc<PagedKv>,
        blocks: Vec<u32>,
        len: usize,
        recurrent: RecurrentState,
        limit: usize,
    ) -> Self {
        let rollback = Rollback::new(&recurrent.0);
        Self { kv, blocks, recurrent, on_device: None, rollback, len, limit, hidden: None }
    }

    /// Positions already processed.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most positions this cache may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// The storage the block table points into (a model on a device keys its own copy of the
    /// keys and values by it).
    pub fn storage(&self) -> &Arc<PagedKv> {
        &self.kv
    }

    /// More blocks for the positions after those the table covers.
    pub fn add_blocks(&mut self, blocks: &[u32]) {
        self.blocks.extend_from_slice(blocks);
    }

    /// Blocks to add before `new_tokens` more positions can be run.
    pub fn blocks_needed(&self, new_tokens: usize) -> usize {
        (self.len + new_tokens).div_ceil(self.kv.block_size()).saturating_sub(self.blocks.len())
    }

    /// The recurrent state; one a device holds is read back on the first call after each step.
    /// A device that cannot give it back (lost) ends the engine with the reason.
    pub fn recurrent(&self) -> &RecurrentState {
        match &self.on_device {
            None => &self.recurrent,
            Some(held) => held.read.get_or_init(|| {
                let first = held.state.first_layer();
                let read =
                    held.state.floats().and_then(|f| self.recurrent.with_floats_from(first, &f));
                read.unwrap_or_else(|e| {
                    panic!("reading a recurrent state back from its device: {e}")
                })
            }),
        }
    }

    /// Replaces the recurrent state with `floats`, laid out as
    /// [`RecurrentState::to_floats`] writes them (a model that moved the state on elsewhere, on
    /// a device, hands it back here); a state of another shape is refused.
    pub fn set_recurrent_floats(&mut self, floats: &[f32]) -> Result<()> {
        self.recurrent = self.recurrent.with_floats(floats)?;
        self.on_device = None;
        Ok(())
    }

    /// The recurrent state is now `state`, which a device moved on and keeps: the host copy is
    /// out of date until [`recurrent`](Self::recurrent) reads it back.
    pub fn hold_recurrent_on_device(&mut self, state: Arc<dyn DeviceRecurrentState>) {
        self.on_device = Some(DeviceHeld { state, read: OnceLock::new() });
    }

    /// The device's state, when a device holds the latest one.
    pub fn recurrent_on_device(&self) -> Option<&Arc<dyn DeviceRecurrentState>> {
        self.on_device.as_ref().map(|held| &held.state)
    }

    /// The state on the host, to move layer `layer`'s on here: where a device holds that
    /// layer's, the device's is read back and let go; where the host holds it already, a copy
    /// read before is of the state before the move.
    fn host_recurrent(&mut self, layer: usize) -> Result<&mut RecurrentState> {
        match self.on_device.take() {
            Some(held) if layer >= held.state.first_layer() => {
                let first = held.state.first_layer();
                self.recurrent = match held.read.into_inner() {
                    Some(read) => read,
                    None => self.recurrent.with_floats_from(first, &held.state.floats()?)?,
                };
            }
            Some(held) => {
                self.on_device = Some(DeviceHeld { state: held.state, read: OnceLock::new() })
            }
            None => {}
        }
        Ok(&mut self.recurrent)
    }

    /// From the next pass on, keeps the final hidden states (what the LM head reads, after the
    /// final norm) of all its rows, for a model with a [`DraftHead`](crate::DraftHead).
    pub fn keep_hidden_states(&mut self) {
        let len = self.len;
        self.hidden.get_or_insert_with(|| (len, Vec::new()));
    }

    /// The kept final hidden states: the position of the first row, and the rows (of the model's
    /// hidden width, one after another) of the latest pass's positions that the cache still
    /// holds; `None` unless asked for.
    pub fn hidden_states(&self) -> Option<(usize, &[f32])> {
        self.hidden.as_ref().map(|(from, rows)| (*from, rows.as_slice()))
    }

    /// Whether [`keep_hidden_states`](Self::keep_hidden_states) asked for them.
    pub fn wants_hidden_states(&self) -> bool {
        self.hidden.is_some()
    }

    /// The rows of the pass that just ran, which ended at [`len`](Self::len).
    pub fn set_hidden_states(&mut self, rows: Vec<f32>, count: usize) {
        self.hidden = Some((self.len - count, rows));
    }

    /// Fails before any work is done when `new_tokens` more would not fit.
    pub fn check_room(&self, new_tokens: usize) -> Result<()> {
        let needed = self.len + new_tokens;
        if needed > self.limit {
            return Err(ModelError::ContextExceeded { needed, limit: self.limit });
        }
        if self.blocks_needed(new_tokens) > 0 {
            return Err(ModelError::BadConfig(format!(
                "the block table covers fewer than the {needed} positions to run"
            )));
        }
        Ok(())
    }

    /// Stores a layer's new keys/values `(1, kv_heads, new, d)` after the processed positions and
    /// returns the causal attention `(1, heads, new, d)` of the queries `q` `(1, heads, new, d)`
    /// over all positions so far (within `window` of each query, if given), keeping up to
    /// `threads` threads busy.
    pub fn attend(
        &mut self,
        layer: usize,
        [q, k, v]: [&Tensor; 3],
        scale: f32,
        window: Option<usize>,
        threads: usize,
    ) -> Result<Tensor> {
        let (_, heads, new, d) = q.dims4()?;
        self.kv.write(layer, &self.blocks, self.len, k, v)?;
        let visibility = Visibility { past: self.len, window };
        let out = with_values(q, |q| {
            self.kv.with_head_runs(layer, &self.blocks, self.len + new, |runs| {
                let queries = Queries { values: q, heads, new, d };
                paged_attention::attend(runs, queries, scale, visibility, threads)
            })
        })?;
        Ok(Tensor::from_vec(out, (1, heads, new, d), &Device::Cpu)?)
    }

    /// An independent standalone copy: the sequence can go on from here while this copy stays
    /// as it is.
    pub fn snapshot(&self) -> Result<Self> {
        let mut copy = Self::standalone(
            &self.kv.shapes(),
            self.kv.kv_type(),
            self.recurrent().clone(),
            self.limit,
        );
        self.kv.copy_sequence(&self.blocks, self.len, &copy.kv, &copy.blocks)?;
        copy.len = self.len;
        Ok(copy)
    }

    /// Linear-attention layer `layer`'s part of a pass: its recurrent state, and where it keeps
    /// the state after each position when the pass verifies drafts (`verifying`).
    pub(crate) fn linear_run(&mut self, layer: usize, verifying: bool) -> Result<LinearRun<'_>> {
        self.host_recurrent(layer)?;
        let state = self.recurrent.0.get_mut(layer).and_then(Option::as_mut).ok_or_else(|| {
            ModelError::BadConfig(format!("layer {layer} has no linear-attention state"))
        })?;
        let history = if verifying { self.rollback.layer(layer) } else { None };
        Ok(LinearRun { state, history })
    }

    /// Records that `n` more positions were processed by every layer.
    pub fn advance(&mut self, n: usize) {
        self.rollback.close();
        self.len += n;
    }

    /// Records that `n` more positions were processed by a pass that verified drafts: the
    /// cache can go back to any of them with [`truncate`](Self::truncate).
    pub fn advance_verified(&mut self, n: usize) {
        self.rollback.verified(self.len..self.len + n);
        self.len += n;
    }

    /// Forgets the positions from `len` on (a speculative round's drafts that were not
    /// accepted). Their keys and values stay in the blocks until later positions overwrite
    /// them; nothing reads past `len`. Recurrent layers go back only to a position of the
    /// latest pass that verified drafts (one they kept the state after; a state a device holds
    /// goes back there); elsewhere this fails and changes nothing.
    pub fn truncate(&mut self, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        if !self.recurrent.is_empty() {
            let went_back = match &mut self.on_device {
                Some(held) => match self.rollback.position_of(len) {
                    Some(position) => {
                        // The layers the host holds go back with the device's, or none does.
                        let host = &mut self.recurrent.0[..held.state.first_layer()];
                        let back =
                            self.rollback.holds(position, host) && held.state.go_back(position)?;
                        if back {
                            self.rollback.restore(position, host);
                            // A copy read before is of the state going back.
                            held.read = OnceLock::new();
                            self.rollback.went_back(len);
                        }
                        back
                    }
                    None => false,
                },
                None => self.rollback.go_back(len, &mut self.recurrent.0),
            };
            if !went_back {
                return Err(ModelError::BadConfig(format!(
                    "the recurrent state cannot go back to position {len}: only to one of the \
                     latest pass that verified drafts"
                )));
            }
        }
        if let Some((from, rows)) = &mut self.hidden {
            let width = rows.len().checked_div(self.len - *from).unwrap_or(0);
            *from = (*from).min(len);
            rows.truncate((len - *from) * width);
        }
        self.len = len;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A device's state of the layers from `first_layer` on: fixed numbers, and how often they
    /// were read back.
    struct Held {
        first_layer: usize,
        floats: Vec<f32>,
        reads: AtomicUsize,
    }

    impl DeviceRecurrentState for Held {
        fn first_layer(&self) -> usize {
            self.first_layer
        }

        fn floats(&self) -> Result<Vec<f32>> {
            self.reads.fetch_add(1, Ordering::Relaxed);
            Ok(self.floats.clone())
        }

        fn go_back(&self, _position: usize) -> Result<bool> {
            Ok(false)
        }

        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn linear_cache() -> SequenceCache {
        let state = LinearAttentionState { conv: vec![0.0; 2], recurrent: vec![0.0; 4] };
        SequenceCache::standalone(&[None], KvType::F32, RecurrentState(vec![Some(state)]), 8)
    }

    #[test]
    fn a_state_held_on_a_device_is_read_back_once_and_let_go_when_the_host_moves_it() {
        let mut cache = linear_cache();
        let floats = (1..=6).map(|i| i as f32).collect();
        let held = Arc::new(Held { first_layer: 0, floats, reads: 0.into() });
        cache.hold_recurrent_on_device(held.clone());
        assert!(cache.recurrent_on_device().is_some());
        for _ in 0..3 {
            assert_eq!(cache.recurrent().to_floats(), held.floats);
        }
        assert_eq!(held.reads.load(Ordering::Relaxed), 1, "read back once");
        // A pass on the host takes the state as read and lets the device's go.
        cache.linear_run(0, false).unwrap();
        assert!(cache.recurrent_on_device().is_none());
        assert_eq!(cache.recurrent().to_floats(), held.floats);
        assert_eq!(held.reads.load(Ordering::Relaxed), 1);
        // Held again and set from the host: the host's numbers, the device's let go unread.
        cache.hold_recurrent_on_device(held.clone());
        cache.set_recurrent_floats(&[0.5; 6]).unwrap();
        assert!(cache.recurrent_on_device().is_none());
        assert_eq!(cache.recurrent().to_floats(), vec![0.5; 6]);
        assert_eq!(held.reads.load(Ordering::Relaxed), 1);
    }

    /// A model whose first block runs on the CPU: the device holds layer 1's state only, the
    /// cache layer 0's, which the host moves on without reading the device's back.
    #[test]
    fn a_device_holding_the_later_layers_leaves_the_first_ones_to_the_host() {
        let state = || Some(LinearAttentionState { conv: vec![0.0; 2], recurrent: vec![0.0; 4] });
        let recurrent = RecurrentState(vec![state(), None, state()]);
        let mut cache = SequenceCache::standalone(&[None; 3], KvType::F32, recurrent, 8);
        let floats: Vec<f32> = (1..=6).map(|i| i as f32).collect();
        let held = Arc::new(Held { first_layer: 1, floats: floats.clone(), reads: 0.into() });
        cache.hold_recurrent_on_device(held.clone());
        let merged = [vec![0.0; 6], floats.clone()].concat();
        assert_eq!(cache.recurrent().to_floats(), merged);
        assert_eq!(cache.recurrent().to_floats_from(1), floats);
        cache.linear_run(0, false).unwrap().state.conv[0] = 9.0;
        assert!(cache.recurrent_on_device().is_some(), "the device keeps layer 2's state");
        let mut moved = merged.clone();
        moved[0] = 9.0;
        assert_eq!(cache.recurrent().to_floats(), moved, "a copy read before the move is gone");
        assert_eq!(held.reads.load(Ordering::Relaxed), 2);
        // Moving the device's layer on the host takes its state back and lets the device go.
        cache.linear_run(2, false).unwrap();
        assert!(cache.recurrent_on_device().is_none());
        assert_eq!(cache.recurrent().to_floats(), moved);
        assert_eq!(held.reads.load(Ordering::Relaxed), 2, "taken as read");
        let wrong = RecurrentState(vec![state(), None, state()]).with_floats_from(1, &merged);
        assert!(wrong.is_err(), "layer 2 holds 6 numbers, not 12");
    }
}
