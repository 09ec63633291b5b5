//! The Gated DeltaNet states of a hybrid's sequences, kept on the device between steps. Each
//! sequence's states sit in a slot of one buffer per layer while its cache holds a
//! [`SlotState`] naming that slot, so a decode step moves no state across the bus (Qwen3.5-35B-A3B
//! keeps ~60 MB a sequence). The host reads a slot back only when the cache asks for its state
//! (a snapshot, the disk tier); a cache that comes with a state the device does not hold (a new
//! sequence, one resumed from a snapshot) has it uploaded into a free slot. A slot is free once
//! no cache holds it. The slots are made for the sequences the placement reserved states for,
//! and grow four at a time while more are held at once. A step that fails after a submission
//! leaves its sequences' states partly moved on: the engine ends the sequences of a failed
//! step. A sequence whose rows verify drafts leaves its state after each position in history
//! rows the step hands out, so that its cache can go back to the last accepted draft on the
//! device ([`DeviceRecurrentState::go_back`]) until the next step reuses the rows.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use spindle_models::{BatchEntry, DeviceRecurrentState, RowRange};

use crate::device::Gpu;
use crate::error::{GpuError, Result};
use crate::linear_state::{DeltaNetShape, LinearRun, LinearRuns, LinearStates};
use crate::loading::model_error;

/// Every linear-attention layer's states of the sequences one model holds on a device.
pub(crate) struct ResidentStates {
    shared: Arc<Shared>,
}

struct Shared {
    gpu: Arc<Gpu>,
    shape: DeltaNetShape,
    /// The model's first layer on the device: the caches keep the states of those before.
    first_layer: usize,
    /// Linear-attention layers on the device.
    layers: usize,
    /// Slots made at the first step.
    first_slots: usize,
    slots: Mutex<Slots>,
}

struct Slots {
    /// One per linear-attention layer, each with `holders.len()` slots.
    states: Vec<LinearStates>,
    /// The state in each slot, as its cache holds it (none left: the slot is free).
    holders: Vec<Weak<SlotState>>,
    /// Slots written from the host and read back to it so far.
    traffic: StateTraffic,
    /// Steps claimed so far: history rows hold the latest one's positions only.
    step: u64,
}

/// The slots a model keeps states in, and the states moved between host and device (a
/// sequence's every layer counts once).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateTraffic {
    pub slots: usize,
    pub uploads: u64,
    pub downloads: u64,
    /// Slots brought back to a position of a pass that verified drafts.
    pub rollbacks: u64,
}

/// A sequence's states in slot `slot` on the device, as its cache holds them.
pub(crate) struct SlotState {
    shared: Arc<Shared>,
    slot: usize,
    /// Where its latest pass left each position's states, when that pass verified drafts.
    kept: Mutex<Option<Kept>>,
}

/// The history rows a step gave a pass that verified drafts: `positions` states from
/// `first_row`, valid while no later step has been claimed.
#[derive(Clone, Copy, Debug)]
struct Kept {
    step: u64,
    first_row: usize,
    positions: usize,
}

impl DeviceRecurrentState for SlotState {
    fn first_layer(&self) -> usize {
        self.shared.first_layer
    }

    fn floats(&self) -> spindle_models::Result<Vec<f32>> {
        self.shared.download(self.slot).map_err(model_error)
    }

    fn go_back(&self, position: usize) -> spindle_models::Result<bool> {
        let kept = *self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let Some(kept) = kept.filter(|k| position < k.positions) else { return Ok(false) };
        self.shared.go_back(self.slot, kept, position).map_err(model_error)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A step's slots: the states' buffers (locked for the step), which slot each entry's rows
/// continue from, and the states to hand the caches once it has run, with the history rows of
/// those that verify drafts.
pub(crate) struct StepSlots<'a> {
    slots: MutexGuard<'a, Slots>,
    pub(crate) runs: LinearRuns,
    held: Vec<Held>,
}

/// An entry's state in a step: as its cache will hold it, its slot, and its history rows.
struct Held {
    state: Arc<dyn DeviceRecurrentState>,
    slot: usize,
    kept: Option<Kept>,
}

impl StepSlots<'_> {
    /// Linear-attention layer `layer`'s states (numbered among those layers).
    pub(crate) fn layer(&self, layer: usize) -> Result<&LinearStates> {
        self.slots
            .states
            .get(layer)
            .ok_or_else(|| GpuError::BadInput("fewer linear-attention states than layers".into()))
    }

    /// Once the step has run: each entry's cache holds its state in its slot, and can go back
    /// to its positions where they verified drafts.
    pub(crate) fn hand_over(self, batch: &mut [BatchEntry<'_>]) {
        for (entry, held) in batch.iter_mut().zip(self.held) {
            if let Some(state) = held.state.as_any().downcast_ref::<SlotState>() {
                *state.kept.lock().unwrap_or_else(|e| e.into_inner()) = held.kept;
            }
            entry.cache.hold_recurrent_on_device(held.state);
        }
    }
}

impl ResidentStates {
    /// No slots yet: the first step makes `first_slots` of them, for the `layers`
    /// linear-attention layers from the model's layer `first_layer` on.
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        shape: DeltaNetShape,
        (first_layer, layers): (usize, usize),
        first_slots: usize,
    ) -> Self {
        let slots =
            Slots { states: Vec::new(), holders: Vec::new(), traffic: Default::default(), step: 0 };
        let (slots, first_slots) = (Mutex::new(slots), first_slots.max(1));
        let shared = Shared { gpu, shape, first_layer, layers, first_slots, slots };
        ResidentStates { shared: Arc::new(shared) }
    }

    pub(crate) fn traffic(&self) -> StateTraffic {
        let slots = self.shared.lock();
        StateTraffic { slots: slots.holders.len(), ..slots.traffic }
    }

    /// A slot for each entry (`rows`: its rows of the step): the one its cache holds, or a free
    /// one its state is uploaded into; and history rows for the positions of each entry that
    /// verifies drafts. A cache whose state has another shape (another model's) is refused
    /// before anything changes.
    pub(crate) fn claim<'a>(
        &'a self,
        batch: &[BatchEntry<'_>],
        rows: &[RowRange],
    ) -> Result<StepSlots<'a>> {
        let shared = &self.shared;
        let per_sequence = shared.layers * shared.shape.state_len();
        let held_here: Vec<Option<usize>> = batch.iter().map(|e| self.slot_of(e)).collect();
        // Read before the lock: a cache may hold a state another device keeps.
        let arriving: Vec<Option<Vec<f32>>> = batch
            .iter()
            .zip(&held_here)
            .map(|(e, held)| match held {
                Some(_) => Ok(None),
                None => {
                    let floats = e.cache.recurrent().to_floats_from(shared.first_layer);
                    if floats.len() != per_sequence {
                        return Err(GpuError::BadInput(format!(
                            "a cache with a recurrent state of {} numbers for a model whose {} \
                             linear-attention layers hold {per_sequence} in all",
                            floats.len(),
                            shared.layers
                        )));
                    }
                    Ok(Some(floats))
                }
            })
            .collect::<Result<_>>()?;
        let mut slots = shared.lock();
        let mut claimed = Vec::with_capacity(batch.len());
        let mut held = Vec::with_capacity(batch.len());
        for ((entry, held_here), floats) in batch.iter().zip(held_here).zip(arriving) {
            let (state, slot): (Arc<dyn DeviceRecurrentState>, usize) = match (held_here, floats) {
                (Some(slot), _) => (entry.cache.recurrent_on_device().expect("held").clone(), slot),
                (None, floats) => {
                    let floats = floats.expect("read above");
                    let slot = shared.free_slot(&mut slots, &claimed)?;
                    shared.write(&mut slots, slot, &floats);
                    let kept = Mutex::new(None);
                    let state = Arc::new(SlotState { shared: shared.clone(), slot, kept });
                    slots.holders[slot] = Arc::downgrade(&state);
                    (state, slot)
                }
            };
            claimed.push(slot);
            held.push(Held { state, slot, kept: None });
        }
        // History rows for the entries that verify drafts: each position but its last.
        slots.step += 1;
        let mut history_rows = 0;
        for ((entry, &(_, rows)), held) in batch.iter().zip(rows).zip(&mut held) {
            if entry.verifies() {
                let positions = rows - 1;
                held.kept = Some(Kept { step: slots.step, first_row: history_rows, positions });
                history_rows += positions;
            }
        }
        for states in &mut slots.states {
            states.keep_history(&shared.gpu, history_rows)?;
        }
        let runs = rows
            .iter()
            .zip(&held)
            .map(|(&(first_row, rows), held)| LinearRun {
                first_row,
                rows,
                slot: held.slot,
                history: held.kept.map(|k| k.first_row),
            })
            .collect();
        Ok(StepSlots { slots, runs: LinearRuns::upload(&shared.gpu, runs)?, held })
    }

    /// The slot of the state `entry`'s cache holds here, if it holds one of these.
    fn slot_of(&self, entry: &BatchEntry<'_>) -> Option<usize> {
        let state = entry.cache.recurrent_on_device()?.as_any().downcast_ref::<SlotState>()?;
        Arc::ptr_eq(&state.shared, &self.shared).then_some(state.slot)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot no cache holds and no entry of this step has, growing the buffers when there is
    /// none.
    fn free_slot(&self, slots: &mut Slots, claimed: &[usize]) -> Result<usize> {
        let free = (0..slots.holders.len())
            .find(|s| slots.holders[*s].strong_count() == 0 && !claimed.contains(s));
        if let Some(slot) = free {
            return Ok(slot);
        }
        // Four at a time past the reserve: a grown buffer is a copy of all the states.
        let old = slots.holders.len();
        let new = if old == 0 { self.first_slots } else { old + 4 };
        let grown = (0..self.layers)
            .map(|_| LinearStates::zeros(&self.gpu, self.shape, new))
            .collect::<Result<Vec<_>>>()?;
        if old > 0 {
            self.gpu.run(|step| {
                for (from, to) in slots.states.iter().zip(&grown) {
                    step.copy(&from.conv, 0, &to.conv, 0, from.conv.len())?;
                    step.copy(&from.recurrent, 0, &to.recurrent, 0, from.recurrent.len())?;
                }
                Ok(())
            })?;
        }
        slots.states = grown;
        slots.holders.resize(new, Weak::new());
        Ok(old)
    }

    /// Puts a sequence's states (every layer's window, then matrices, as
    /// `RecurrentState::to_floats` lays them out) into `slot`.
    fn write(&self, slots: &mut Slots, slot: usize, floats: &[f32]) {
        let (conv_len, matrices_len) =
            (self.shape.conv_state_len(), self.shape.recurrent_state_len());
        for (layer, states) in floats.chunks_exact(self.shape.state_len()).zip(&slots.states) {
            let (conv, matrices) = layer.split_at(conv_len);
            self.gpu.write(&states.conv, slot * conv_len, conv);
            self.gpu.write(&states.recurrent, slot * matrices_len, matrices);
        }
        slots.traffic.uploads += 1;
    }

    /// Brings slot `slot` back to its state after position `position` of the pass that `kept`
    /// records; false, changing nothing, once a later step has reused the history rows.
    fn go_back(&self, slot: usize, kept: Kept, position: usize) -> Result<bool> {
        let mut slots = self.lock();
        if kept.step != slots.step {
            return Ok(false);
        }
        self.gpu.run(|step| {
            for states in &slots.states {
                states.restore(step, kept.first_row + position, slot)?;
            }
            Ok(())
        })?;
        slots.traffic.rollbacks += 1;
        Ok(true)
    }

    /// Slot `slot`'s states, laid out as [`Shared::write`] takes them.
    fn download(&self, slot: usize) -> Result<Vec<f32>> {
        let mut slots = self.lock();
        let (conv_len, matrices_len) =
            (self.shape.conv_state_len(), self.shape.recurrent_state_len());
        let reads = self.gpu.run(|step| {
            let reads = slots.states.iter().map(|states| {
                let conv = step.read_range(&states.conv, slot * conv_len, conv_len)?;
                let matrices =
                    step.read_range(&states.recurrent, slot * matrices_len, matrices_len)?;
                Ok((conv, matrices))
            });
            reads.collect::<Result<Vec<_>>>()
        })?;
        slots.traffic.downloads += 1;
        let mut floats = Vec::with_capacity(self.layers * self.shape.state_len());
        for (conv, matrices) in reads {
            floats.extend(conv.values()?);
            floats.extend(matrices.values()?);
        }
        Ok(floats)
    }
}
