//! What a sequence's tokens become on their way to the client: text (never a split UTF-8
//! character), cut at the first stop string, and routed into reasoning or content. Every response
//! is this stream of deltas; a non-streaming response is the same deltas collected.

use spindle_chat::{IncrementalDecoder, ReasoningSplitter, StopMatcher, Tokenizer};

/// Text produced by one step, already split by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TextDelta {
    pub reasoning: String,
    pub content: String,
}

impl TextDelta {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// How the generated text is split into reasoning and content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReasoningMode {
    /// Everything is content (the template knows no reasoning block, or thinking is off).
    Off,
    /// Text between the model's tags (its profile's, e.g. `<think>` / `</think>`) is
    /// reasoning; `starts_inside` when the prompt already opened the block.
    Tagged { open: String, close: String, starts_inside: bool },
}

/// Per-sequence text state: detokenizer, stop matcher, reasoning splitter, in that order, so a
/// stop string is honoured inside reasoning too and never reaches either field.
pub struct OutputPipeline {
    decoder: IncrementalDecoder,
    stops: StopMatcher,
    splitter: Option<ReasoningSplitter>,
}

impl OutputPipeline {
    pub fn new(stops: &[String], reasoning: ReasoningMode) -> Self {
        let splitter = match reasoning {
            ReasoningMode::Off => None,
            ReasoningMode::Tagged { open, close, starts_inside } => {
                Some(ReasoningSplitter::new(&open, &close, starts_inside))
            }
        };
        Self { decoder: IncrementalDecoder::new(), stops: StopMatcher::new(stops), splitter }
    }

    /// Adds one generated token. Returns the text it releases and whether a stop string ended
    /// the output (the stop text and whatever follows it are dropped).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> (TextDelta, bool) {
        let text = self.decoder.push(tok, id);
        let step = self.stops.push(&text);
        let mut delta = self.split(&step.text);
        if step.stopped {
            let tail = self.flush_splitter();
            delta.reasoning.push_str(&tail.reasoning);
            delta.content.push_str(&tail.content);
        }
        (delta, step.stopped)
    }

    /// End of generation: releases everything held back. Also says whether a stop string
    /// completed in that last text (a held-back match can only be confirmed at the end).
    pub fn finish(&mut self) -> (TextDelta, bool) {
        let text = self.decoder.flush();
        let mut held = self.stops.push(&text).text;
        held.push_str(&self.stops.finish());
        let mut delta = self.split(&held);
        let tail = self.flush_splitter();
        delta.reasoning.push_str(&tail.reasoning);
        delta.content.push_str(&tail.content);
        (delta, self.stops.stopped())
    }

    /// The stop string that ended the output, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.stops.matched()
    }

    /// Whether the text so far is inside an open reasoning block.
    pub fn in_reasoning(&self) -> bool {
        self.splitter.as_ref().is_some_and(ReasoningSplitter::in_reasoning)
    }

    fn split(&mut self, text: &str) -> TextDelta {
        match &mut self.splitter {
            None => TextDelta { reasoning: String::new(), content: text.to_string() },
            Some(s) => {
                let split = s.push(text);
                TextDelta { reasoning: split.reasoning, content: split.content }
            }
        }
    }

    fn flush_splitter(&mut self) -> TextDelta {
        match &mut self.splitter {
            None => TextDelta::default(),
            Some(s) => {
                let split = s.finish();
                TextDelta { reasoning: split.reasoning, content: split.content }
            }
        }
    }
}
